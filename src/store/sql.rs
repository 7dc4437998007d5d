//! The SQL both backends share. PostgreSQL and SQLite accept the same statements here
//! (`$N` placeholders, `ON CONFLICT`, `RETURNING`, `CAST`), so one implementation is stamped
//! out for each by `impl_sql_store!`; only connecting, beginning a study transaction and
//! locking the study row differ, and those are passed in.

macro_rules! study_cols {
    () => {
        "id, name, state, state_reason, spec, next_trial_id, change_seq, designer_state, created_by, created_at, \
         updated_at, n_requested, n_active, n_stopping, n_completed, n_infeasible, n_failed, n_paused"
    };
}
macro_rules! trial_cols {
    () => {
        "study_id, id, state, parameters, client_id, final_measurement, objective, infeasible_reason, \
         fail_reason, early_stopped, excluded, lease_expires_at, created_at, started_at, completed_at, change_seq, \
         attempts, budget, lineage"
    };
}
pub(super) use {study_cols, trial_cols};

pub(super) const INSERT_STUDY: &str = concat!(
    "INSERT INTO studies (name, state, spec, next_trial_id, created_by, created_at, updated_at) \
     VALUES ($1, 'active', $2, 1, $4, $3, $3) RETURNING ",
    study_cols!()
);
/// An Optuna study: its name also in `optuna_name`, unique, so of two creating one name at
/// once one inserts and the other gets no row back.
pub(super) const INSERT_OPTUNA_STUDY: &str = concat!(
    "INSERT INTO studies (name, optuna_name, state, spec, next_trial_id, created_by, created_at, updated_at) \
     VALUES ($1, $1, 'active', $2, 1, $4, $3, $3) ON CONFLICT (optuna_name) DO NOTHING RETURNING ",
    study_cols!()
);
pub(super) const OPTUNA_STUDY_ID: &str = "SELECT id FROM studies WHERE optuna_name = $1";
pub(super) const GET_STUDY: &str = concat!("SELECT ", study_cols!(), " FROM studies WHERE id = $1");
pub(super) const LIST_STUDIES: &str = concat!(
    "SELECT ",
    study_cols!(),
    " FROM studies WHERE (CAST($1 AS TEXT) IS NULL OR state = $1) \
     AND (CAST($2 AS TEXT) IS NULL OR lower(name) LIKE $2 ESCAPE '\\') \
     AND id > $3 ORDER BY id LIMIT $4"
);
pub(super) const DELETE_STUDY: &str = "DELETE FROM studies WHERE id = $1";
/// One row per study, not per trial: the studies keep their counts.
pub(super) const COUNT_ALL_TRIALS: &str = "SELECT CAST(COALESCE(SUM(n_requested), 0) AS BIGINT), \
     CAST(COALESCE(SUM(n_active), 0) AS BIGINT), CAST(COALESCE(SUM(n_stopping), 0) AS BIGINT), \
     CAST(COALESCE(SUM(n_completed), 0) AS BIGINT), CAST(COALESCE(SUM(n_infeasible), 0) AS BIGINT), \
     CAST(COALESCE(SUM(n_failed), 0) AS BIGINT), CAST(COALESCE(SUM(n_paused), 0) AS BIGINT) FROM studies";
pub(super) const BEST_TRIAL_MAX: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND objective IS NOT NULL AND state = 'completed' \
     AND excluded = FALSE ORDER BY objective DESC, id LIMIT 1"
);
pub(super) const BEST_TRIAL_MIN: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND objective IS NOT NULL AND state = 'completed' \
     AND excluded = FALSE ORDER BY objective ASC, id LIMIT 1"
);
pub(super) const LIST_TRIALS: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND (CAST($2 AS TEXT) IS NULL OR state = $2) \
     AND id > $3 ORDER BY id LIMIT $4"
);
pub(super) const CHANGED_TRIALS: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND (change_seq, id) > ($2, $3) ORDER BY change_seq, id LIMIT $4"
);
/// `TrialPoint` columns: the JSON ones as text, parsed straight into their types.
macro_rules! trial_point_cols {
    () => {
        "study_id, id, state, CAST(parameters AS TEXT) AS parameters, \
         CAST(final_measurement AS TEXT) AS final_measurement, early_stopped, excluded, budget"
    };
}
pub(super) const ALL_TRIAL_POINTS: &str = concat!(
    "SELECT ",
    trial_point_cols!(),
    " FROM trials WHERE study_id = $1 ORDER BY id"
);
pub(super) const CHANGED_TRIAL_POINTS: &str = concat!(
    "SELECT ",
    trial_point_cols!(),
    " FROM trials WHERE study_id = $1 AND change_seq > $2 ORDER BY change_seq, id LIMIT $3"
);
pub(super) const LATEST_COMPLETED: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND state = 'completed' AND excluded = FALSE \
     ORDER BY id DESC LIMIT $2"
);
pub(super) const GET_TRIAL: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND id = $2"
);
pub(super) const ALL_TRIALS: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 ORDER BY id"
);
pub(super) const UNFINISHED_TRIALS: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND state IN ('requested', 'active', 'stopping') ORDER BY id"
);
pub(super) const PAUSED_TRIALS: &str = concat!(
    "SELECT ",
    trial_cols!(),
    " FROM trials WHERE study_id = $1 AND state = 'paused' ORDER BY id"
);
/// Study-level stopping's input: the completed trials that rank (an objective, not
/// excluded), in the order they completed.
pub(super) const COMPLETED_OBJECTIVES: &str = "SELECT id, objective, completed_at FROM trials \
     WHERE study_id = $1 AND state = 'completed' AND objective IS NOT NULL AND excluded = FALSE \
     AND completed_at IS NOT NULL ORDER BY completed_at, id";
pub(super) const COUNT_FAILED: &str =
    "SELECT COUNT(*) FROM trials WHERE study_id = $1 AND state = 'failed'";
pub(super) const MEASUREMENTS_RANGE: &str = "SELECT trial_id, step, elapsed_secs, metrics FROM measurements \
     WHERE study_id = $1 AND trial_id BETWEEN $2 AND $3 ORDER BY trial_id, step";
pub(super) const SET_DESIGNER_STATE: &str = "UPDATE studies SET designer_state = $2 WHERE id = $1";
/// Writes a trial whole: inserts a new one, or overwrites every mutable column of an
/// existing one (`created_at` stays), so new and changed trials share one statement.
pub(super) const UPSERT_TRIAL: &str = concat!(
    "INSERT INTO trials (",
    trial_cols!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) \
     ON CONFLICT (study_id, id) DO UPDATE SET state = excluded.state, \
     parameters = excluded.parameters, client_id = excluded.client_id, \
     final_measurement = excluded.final_measurement, objective = excluded.objective, \
     infeasible_reason = excluded.infeasible_reason, fail_reason = excluded.fail_reason, \
     early_stopped = excluded.early_stopped, excluded = excluded.excluded, \
     lease_expires_at = excluded.lease_expires_at, started_at = excluded.started_at, \
     completed_at = excluded.completed_at, change_seq = excluded.change_seq, \
     attempts = excluded.attempts, budget = excluded.budget, lineage = excluded.lineage"
);
pub(super) const UPSERT_MEASUREMENT: &str = "INSERT INTO measurements \
     (study_id, trial_id, step, elapsed_secs, metrics, created_at) VALUES ($1, $2, $3, $4, $5, $6) \
     ON CONFLICT (study_id, trial_id, step) DO UPDATE SET elapsed_secs = excluded.elapsed_secs, \
     metrics = excluded.metrics, created_at = excluded.created_at";
pub(super) const UPDATE_STUDY: &str = "UPDATE studies SET state = $2, state_reason = $3, spec = $4, \
     next_trial_id = $5, updated_at = $6, change_seq = $7, n_requested = $8, n_active = $9, \
     n_stopping = $10, n_completed = $11, n_infeasible = $12, n_failed = $13, n_paused = $14 WHERE id = $1";
pub(super) const INSERT_TOKEN: &str = "INSERT INTO api_tokens (name, token_hash, study_id, trial_id, created_at) \
     VALUES ($1, $2, $3, $4, $5)";
macro_rules! token_cols {
    () => {
        "name, study_id, trial_id, role, expires_at, created_at, last_used_at"
    };
}
pub(super) const FIND_TOKEN: &str = concat!(
    "SELECT ",
    token_cols!(),
    " FROM api_tokens WHERE token_hash = $1"
);
/// Tokens of people and programs, not of trials.
pub(super) const LIST_TOKENS: &str = concat!(
    "SELECT ",
    token_cols!(),
    " FROM api_tokens WHERE study_id IS NULL ORDER BY name"
);
pub(super) const INSERT_ROLE_TOKEN: &str = "INSERT INTO api_tokens \
     (name, token_hash, role, expires_at, created_at) VALUES ($1, $2, $3, $4, $5)";
pub(super) const TOUCH_TOKEN: &str = "UPDATE api_tokens SET last_used_at = $2 WHERE name = $1";
pub(super) const INSERT_AUDIT: &str = "INSERT INTO audit_events \
     (at, actor, action, study_id, trial_id, detail) VALUES ($1, $2, $3, $4, $5, $6)";
pub(super) const LIST_AUDIT: &str = "SELECT id, at, actor, action, study_id, trial_id, detail \
     FROM audit_events WHERE id > $1 ORDER BY id LIMIT $2";
/// A webhook call, before its first attempt.
pub(super) const INSERT_DELIVERY: &str = "INSERT INTO notification_deliveries \
     (study_id, event, trial_id, target, url, state, attempts, created_at, updated_at) \
     VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, $6) RETURNING id";
pub(super) const UPDATE_DELIVERY: &str = "UPDATE notification_deliveries \
     SET state = $2, attempts = $3, last_status = $4, last_error = $5, updated_at = $6 WHERE id = $1";
pub(super) const LIST_DELIVERIES: &str = "SELECT id, study_id, event, trial_id, target, url, \
     state, attempts, last_status, last_error, created_at, updated_at \
     FROM notification_deliveries WHERE study_id = $1 AND id > $2 ORDER BY id LIMIT $3";
pub(super) const CLAIM_RUNNER: &str = "INSERT INTO study_runners (study_id, owner, expires_at) VALUES ($1, $2, $3) \
     ON CONFLICT (study_id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at \
     WHERE study_runners.owner = excluded.owner OR study_runners.expires_at < $4";
pub(super) const RUNNER_LEASE: &str =
    "SELECT owner, expires_at FROM study_runners WHERE study_id = $1";
pub(super) const RELEASE_RUNNER: &str =
    "DELETE FROM study_runners WHERE study_id = $1 AND owner = $2";
/// A replica's lease: taken or renewed by the replica itself.
pub(super) const RENEW_REPLICA: &str = "INSERT INTO replicas (id, url, expires_at) VALUES ($1, $2, $3) \
     ON CONFLICT (id) DO UPDATE SET url = excluded.url, expires_at = excluded.expires_at";
/// Replicas gone for a minute are forgotten (their leases are long expired).
pub(super) const FORGET_REPLICAS: &str = "DELETE FROM replicas WHERE expires_at < $1";
pub(super) const LIVE_REPLICAS: &str =
    "SELECT id, url FROM replicas WHERE expires_at > $1 ORDER BY id";
pub(super) const REMOVE_REPLICA: &str = "DELETE FROM replicas WHERE id = $1";
pub(super) const OFFER_REPLICA_SECRET: &str =
    "INSERT INTO replica_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING";
pub(super) const REPLICA_SECRET: &str = "SELECT secret FROM replica_secret WHERE id = 1";
/// The time since a pool worker's last report, at most `$max` ms (a worker gone a while
/// is not counted idle all that time): `$now` and `$max` are the statement's parameters.
macro_rules! pool_gap {
    ($now:literal, $last:literal, $max:literal) => {
        concat!(
            "(CASE WHEN ",
            $now,
            " - ",
            $last,
            " > ",
            $max,
            " THEN ",
            $max,
            " WHEN ",
            $now,
            " - ",
            $last,
            " < 0 THEN 0 ELSE ",
            $now,
            " - ",
            $last,
            " END)"
        )
    };
}
/// A pool worker's slot-seconds since its last report, added to its pool's minute (`$3`)
/// before the report itself replaces its busy count (`REPORT_POOL_WORKER`).
pub(super) const ADD_POOL_USAGE: &str = concat!(
    "INSERT INTO pool_usage (pool, minute_ms, busy_slot_secs, idle_slot_secs) \
     SELECT pool, $3, busy * gap / 1000.0, (slots - busy) * gap / 1000.0 FROM \
     (SELECT pool, slots, busy, ",
    pool_gap!("$4", "last_seen_ms", "$5"),
    " AS gap FROM pool_workers WHERE pool = $1 AND worker = $2) AS w WHERE gap > 0 \
     ON CONFLICT (pool, minute_ms) DO UPDATE SET \
     busy_slot_secs = pool_usage.busy_slot_secs + excluded.busy_slot_secs, \
     idle_slot_secs = pool_usage.idle_slot_secs + excluded.idle_slot_secs"
);
/// Register or renew a pool worker; the time since its last report (at most `$8` ms) is
/// added to its busy and idle slot-seconds by the busy count it reported then.
pub(super) const REPORT_POOL_WORKER: &str = concat!(
    "INSERT INTO pool_workers (pool, worker, host, slots, gpus, busy, registered_at_ms, last_seen_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (pool, worker) DO UPDATE SET \
     busy_slot_secs = pool_workers.busy_slot_secs + pool_workers.busy * ",
    pool_gap!("excluded.last_seen_ms", "pool_workers.last_seen_ms", "$8"),
    " / 1000.0, idle_slot_secs = pool_workers.idle_slot_secs + (pool_workers.slots - pool_workers.busy) * ",
    pool_gap!("excluded.last_seen_ms", "pool_workers.last_seen_ms", "$8"),
    " / 1000.0, host = excluded.host, slots = excluded.slots, gpus = excluded.gpus, \
     busy = excluded.busy, last_seen_ms = excluded.last_seen_ms"
);
macro_rules! pool_worker_cols {
    () => {
        "pool, worker, host, slots, gpus, busy, registered_at_ms, last_seen_ms, busy_slot_secs, \
         idle_slot_secs"
    };
}
pub(super) const LIST_POOL_WORKERS: &str = concat!(
    "SELECT ",
    pool_worker_cols!(),
    " FROM pool_workers ORDER BY pool, worker"
);
pub(super) const LIST_WORKERS_OF_POOL: &str = concat!(
    "SELECT ",
    pool_worker_cols!(),
    " FROM pool_workers WHERE pool = $1 ORDER BY worker"
);
pub(super) const LIST_POOL_USAGE: &str = "SELECT minute_ms, busy_slot_secs, idle_slot_secs \
     FROM pool_usage WHERE pool = $1 AND minute_ms >= $2 ORDER BY minute_ms";
pub(super) const REPLACE_TOKEN: &str = "INSERT INTO api_tokens (name, token_hash, study_id, trial_id, created_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, \
     study_id = excluded.study_id, trial_id = excluded.trial_id, created_at = excluded.created_at, \
     role = excluded.role, expires_at = excluded.expires_at";
pub(super) const DELETE_TOKEN: &str = "DELETE FROM api_tokens WHERE name = $1";
pub(super) const DELETE_TRIAL_TOKEN: &str =
    "DELETE FROM api_tokens WHERE study_id = $1 AND trial_id = $2";
pub(super) const COUNT_TOKENS: &str = "SELECT COUNT(*) FROM api_tokens WHERE study_id IS NULL";

/// Implements `Store` for `$store` (with field `pool: sqlx::Pool<$db>`). Study transactions
/// are the backend's `$studies`, which has `fn begin(&$store) -> Box<dyn StudiesTx>`:
/// `impl_row_study_tx!` on SQLite, hand-written and batched on PostgreSQL.
/// Notes and tags (`annotations`) and user attributes of a study's trials in a range of ids
/// (trial 0: the study itself).
pub(super) const ANNOTATIONS_IN_RANGE: &str = "SELECT trial_id, note, tags FROM annotations \
     WHERE study_id = $1 AND trial_id BETWEEN $2 AND $3";
pub(super) const USER_ATTRS_IN_RANGE: &str = "SELECT trial_id, name, value FROM user_attrs \
     WHERE study_id = $1 AND trial_id BETWEEN $2 AND $3 ORDER BY trial_id, name";
/// The studies' own (trial 0) for a range of study ids: one query for a page of studies.
pub(super) const STUDY_ANNOTATIONS_IN_RANGE: &str = "SELECT study_id, note, tags FROM annotations \
     WHERE trial_id = 0 AND study_id BETWEEN $1 AND $2";
pub(super) const STUDY_USER_ATTRS_IN_RANGE: &str = "SELECT study_id, name, value FROM user_attrs \
     WHERE trial_id = 0 AND study_id BETWEEN $1 AND $2 ORDER BY study_id, name";
/// One statement per field, so that two people changing different fields lose nothing.
pub(super) const SET_NOTE: &str = "INSERT INTO annotations (study_id, trial_id, note, updated_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (study_id, trial_id) \
     DO UPDATE SET note = excluded.note, updated_at = excluded.updated_at";
pub(super) const SET_TAGS: &str = "INSERT INTO annotations (study_id, trial_id, tags, updated_at) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (study_id, trial_id) \
     DO UPDATE SET tags = excluded.tags, updated_at = excluded.updated_at";
pub(super) const SET_USER_ATTR: &str = "INSERT INTO user_attrs (study_id, trial_id, name, value) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (study_id, trial_id, name) DO UPDATE SET value = excluded.value";
/// The value of a study's first trial (by id, trials only) holding the user attribute `name`:
/// one seek in `user_attrs_study_name_idx`.
pub(super) const FIRST_TRIAL_ATTR: &str = "SELECT value FROM user_attrs \
     WHERE study_id = $1 AND name = $2 AND trial_id > 0 ORDER BY trial_id LIMIT 1";
pub(super) const DELETE_USER_ATTR: &str =
    "DELETE FROM user_attrs WHERE study_id = $1 AND trial_id = $2 AND name = $3";
pub(super) const COUNT_USER_ATTRS: &str =
    "SELECT COUNT(*) FROM user_attrs WHERE study_id = $1 AND trial_id = $2";

macro_rules! impl_sql_store {
    ($store:ty, $studies:ident, $db:ty, $backend:literal) => {
        use $crate::model::{
            Measurement, StudyId, StudySpec, StudyState, TrialCounts, TrialId, TrialKey,
            TrialPoint, TrialState,
        };
        use $crate::store::records::{
            AuditRow, DeliveryRow, MeasurementRow, StudyRow, TokenRow, TrialPointRow, TrialRow,
            annotations_by_key, to_json,
        };
        use $crate::store::sql::*;
        use $crate::store::{
            AuditEntry, AuditRecord, ChangeCursor, DeliveryProgress, DeliveryRecord, NewDelivery,
            PoolUsageRecord, PoolWorkerRecord, PoolWorkerReport, ReplicaRecord, StoreResult,
            StudiesTx, StudyLock, StudyRecord, StudyTx, TokenRecord, TrialRecord, TrialToken,
        };

        fn trials_from(rows: Vec<TrialRow>) -> StoreResult<Vec<TrialRecord>> {
            rows.into_iter().map(TrialRecord::try_from).collect()
        }

        /// `INSERT_TOKEN` or `REPLACE_TOKEN` with a token row's values bound.
        fn token_query<'q>(
            sql: &'static str,
            name: &'q str,
            token_hash: &'q str,
            scope: Option<TrialKey>,
            now: chrono::DateTime<chrono::Utc>,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments> {
            sqlx::query(sql)
                .bind(name)
                .bind(token_hash)
                .bind(scope.map(|s| s.study))
                .bind(scope.map(|s| s.trial))
                .bind(now)
        }

        #[async_trait::async_trait]
        impl $crate::store::Store for $store {
            fn backend(&self) -> &'static str {
                $backend
            }

            fn connections(&self) -> Vec<$crate::store::PoolUse> {
                self.pool_use()
            }

            #[tracing::instrument(skip_all)]
            async fn ping(&self) -> StoreResult<()> {
                sqlx::query("SELECT 1").execute(&self.pool).await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn insert_study(
                &self,
                spec: &StudySpec,
                created_by: Option<&str>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<StudyRecord> {
                let spec_json = to_json(spec)?;
                let mut conn = self.pool.acquire().await?;
                let row: StudyRow = sqlx::query_as(INSERT_STUDY)
                    .bind(&spec.name)
                    .bind(spec_json)
                    .bind(now)
                    .bind(created_by)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err($crate::store::StoreError::after_sending)?;
                row.try_into()
            }

            #[tracing::instrument(skip_all)]
            async fn insert_optuna_study(
                &self,
                spec: &StudySpec,
                created_by: Option<&str>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<Option<StudyRecord>> {
                let spec_json = to_json(spec)?;
                let mut conn = self.pool.acquire().await?;
                let row: Option<StudyRow> = sqlx::query_as(INSERT_OPTUNA_STUDY)
                    .bind(&spec.name)
                    .bind(spec_json)
                    .bind(now)
                    .bind(created_by)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err($crate::store::StoreError::after_sending)?;
                row.map(StudyRecord::try_from).transpose()
            }

            #[tracing::instrument(skip_all)]
            async fn optuna_study_id(&self, name: &str) -> StoreResult<Option<StudyId>> {
                let id: Option<(StudyId,)> = sqlx::query_as(OPTUNA_STUDY_ID)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(id.map(|(id,)| id))
            }

            #[tracing::instrument(skip_all)]
            async fn first_trial_attr(
                &self,
                study_id: StudyId,
                name: &str,
            ) -> StoreResult<Option<serde_json::Value>> {
                let value: Option<(String,)> = sqlx::query_as(FIRST_TRIAL_ATTR)
                    .bind(study_id)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?;
                value
                    .map(|(text,)| {
                        serde_json::from_str(&text).map_err(|e| {
                            $crate::store::StoreError::Corrupt(format!(
                                "user attribute {name} of study {study_id}: {e}"
                            ))
                        })
                    })
                    .transpose()
            }

            #[tracing::instrument(skip_all)]
            async fn get_study(&self, study_id: StudyId) -> StoreResult<Option<StudyRecord>> {
                let row: Option<StudyRow> = sqlx::query_as(GET_STUDY)
                    .bind(study_id)
                    .fetch_optional(&self.pool)
                    .await?;
                row.map(StudyRecord::try_from).transpose()
            }

            #[tracing::instrument(skip_all)]
            async fn list_studies(
                &self,
                state: Option<StudyState>,
                name_contains: Option<&str>,
                after_id: StudyId,
                limit: i64,
            ) -> StoreResult<Vec<StudyRecord>> {
                let pattern = name_contains.map(|n| {
                    let escaped = n
                        .to_lowercase()
                        .replace('\\', "\\\\")
                        .replace('%', "\\%")
                        .replace('_', "\\_");
                    format!("%{escaped}%")
                });
                let rows: Vec<StudyRow> = sqlx::query_as(LIST_STUDIES)
                    .bind(state.map(|s| s.as_str()))
                    .bind(pattern)
                    .bind(after_id)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                rows.into_iter().map(StudyRecord::try_from).collect()
            }

            #[tracing::instrument(skip_all)]
            async fn delete_study(&self, study_id: StudyId) -> StoreResult<bool> {
                let mut conn = self.pool.acquire().await?;
                let done = sqlx::query(DELETE_STUDY)
                    .bind(study_id)
                    .execute(&mut *conn)
                    .await
                    .map_err($crate::store::StoreError::after_sending)?;
                Ok(done.rows_affected() > 0)
            }

            #[tracing::instrument(skip_all)]
            async fn count_all_trials(&self) -> StoreResult<TrialCounts> {
                let row: (i64, i64, i64, i64, i64, i64, i64) = sqlx::query_as(COUNT_ALL_TRIALS)
                    .fetch_one(&self.pool)
                    .await?;
                Ok(TrialCounts::from_columns([
                    row.0, row.1, row.2, row.3, row.4, row.5, row.6,
                ]))
            }

            #[tracing::instrument(skip_all)]
            async fn best_trial(
                &self,
                study_id: StudyId,
                maximize: bool,
            ) -> StoreResult<Option<TrialRecord>> {
                let sql = if maximize {
                    BEST_TRIAL_MAX
                } else {
                    BEST_TRIAL_MIN
                };
                let row: Option<TrialRow> = sqlx::query_as(sql)
                    .bind(study_id)
                    .fetch_optional(&self.pool)
                    .await?;
                row.map(TrialRecord::try_from).transpose()
            }

            #[tracing::instrument(skip_all)]
            async fn list_trials(
                &self,
                study_id: StudyId,
                state: Option<TrialState>,
                after_id: TrialId,
                limit: i64,
            ) -> StoreResult<Vec<TrialRecord>> {
                let rows: Vec<TrialRow> = sqlx::query_as(LIST_TRIALS)
                    .bind(study_id)
                    .bind(state.map(|s| s.as_str()))
                    .bind(after_id)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                trials_from(rows)
            }

            #[tracing::instrument(skip_all)]
            async fn changed_trials(
                &self,
                study_id: StudyId,
                after: ChangeCursor,
                limit: i64,
            ) -> StoreResult<Vec<TrialRecord>> {
                let rows: Vec<TrialRow> = sqlx::query_as(CHANGED_TRIALS)
                    .bind(study_id)
                    .bind(after.change_seq)
                    .bind(after.trial)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                trials_from(rows)
            }

            #[tracing::instrument(skip_all)]
            async fn get_trial(
                &self,
                study_id: StudyId,
                trial_id: TrialId,
            ) -> StoreResult<Option<TrialRecord>> {
                let row: Option<TrialRow> = sqlx::query_as(GET_TRIAL)
                    .bind(study_id)
                    .bind(trial_id)
                    .fetch_optional(&self.pool)
                    .await?;
                row.map(TrialRecord::try_from).transpose()
            }

            #[tracing::instrument(skip_all)]
            async fn all_trials(&self, study_id: StudyId) -> StoreResult<Vec<TrialRecord>> {
                let rows: Vec<TrialRow> = sqlx::query_as(ALL_TRIALS)
                    .bind(study_id)
                    .fetch_all(&self.pool)
                    .await?;
                trials_from(rows)
            }

            #[tracing::instrument(skip_all)]
            async fn latest_completed(
                &self,
                study_id: StudyId,
                limit: i64,
            ) -> StoreResult<Vec<TrialRecord>> {
                let rows: Vec<TrialRow> = sqlx::query_as(LATEST_COMPLETED)
                    .bind(study_id)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                trials_from(rows)
            }

            #[tracing::instrument(skip_all)]
            async fn trial_points(
                &self,
                study_id: StudyId,
                changed_after: Option<i64>,
                limit: i64,
            ) -> StoreResult<Vec<TrialPoint>> {
                let query = match changed_after {
                    None => sqlx::query_as::<_, TrialPointRow>(ALL_TRIAL_POINTS).bind(study_id),
                    Some(seq) => sqlx::query_as(CHANGED_TRIAL_POINTS)
                        .bind(study_id)
                        .bind(seq)
                        .bind(limit),
                };
                let rows = query.fetch_all(&self.pool).await?;
                rows.into_iter().map(TrialPoint::try_from).collect()
            }

            #[tracing::instrument(skip_all)]
            async fn measurements(
                &self,
                study_id: StudyId,
                first_trial: TrialId,
                last_trial: TrialId,
            ) -> StoreResult<Vec<(TrialId, Measurement)>> {
                let rows: Vec<MeasurementRow> = sqlx::query_as(MEASUREMENTS_RANGE)
                    .bind(study_id)
                    .bind(first_trial)
                    .bind(last_trial)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            #[tracing::instrument(skip_all)]
            async fn answer_measurements(
                &self,
                study_id: StudyId,
                first_trial: TrialId,
                last_trial: TrialId,
            ) -> StoreResult<Vec<(TrialId, Measurement)>> {
                let query = sqlx::query_as::<_, MeasurementRow>(MEASUREMENTS_RANGE)
                    .bind(study_id)
                    .bind(first_trial)
                    .bind(last_trial);
                // A read connection free right now is as good (and the answers' few
                // connections then stay free for when none is).
                let rows = match self.pool.try_acquire() {
                    Some(mut conn) => query.fetch_all(&mut *conn).await?,
                    None => query.fetch_all(self.answer_pool()).await?,
                };
                Ok(rows.into_iter().map(Into::into).collect())
            }

            #[tracing::instrument(skip_all)]
            async fn set_designer_state(
                &self,
                study_id: StudyId,
                state: &serde_json::Value,
            ) -> StoreResult<()> {
                sqlx::query(SET_DESIGNER_STATE)
                    .bind(study_id)
                    .bind(sqlx::types::Json(state))
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn annotations(
                &self,
                study_id: StudyId,
                first: TrialId,
                last: TrialId,
            ) -> StoreResult<std::collections::BTreeMap<TrialId, $crate::model::Annotations>> {
                let notes = sqlx::query_as(ANNOTATIONS_IN_RANGE)
                    .bind(study_id)
                    .bind(first)
                    .bind(last)
                    .fetch_all(&self.pool)
                    .await?;
                let attrs = sqlx::query_as(USER_ATTRS_IN_RANGE)
                    .bind(study_id)
                    .bind(first)
                    .bind(last)
                    .fetch_all(&self.pool)
                    .await?;
                annotations_by_key(notes, attrs, &format!("study {study_id} trial"))
            }

            #[tracing::instrument(skip_all)]
            async fn study_annotations(
                &self,
                first: StudyId,
                last: StudyId,
            ) -> StoreResult<std::collections::BTreeMap<StudyId, $crate::model::Annotations>> {
                let notes = sqlx::query_as(STUDY_ANNOTATIONS_IN_RANGE)
                    .bind(first)
                    .bind(last)
                    .fetch_all(&self.pool)
                    .await?;
                let attrs = sqlx::query_as(STUDY_USER_ATTRS_IN_RANGE)
                    .bind(first)
                    .bind(last)
                    .fetch_all(&self.pool)
                    .await?;
                annotations_by_key(notes, attrs, "study")
            }

            #[tracing::instrument(skip_all)]
            async fn annotate(
                &self,
                study_id: StudyId,
                trial_id: TrialId,
                update: &$crate::model::AnnotationUpdate,
                max_user_attrs: usize,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<bool> {
                let mut tx = self.pool.begin().await?;
                if let Some(note) = &update.note {
                    sqlx::query(SET_NOTE)
                        .bind(study_id)
                        .bind(trial_id)
                        .bind((!note.is_empty()).then_some(note.as_str()))
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some(tags) = &update.tags {
                    sqlx::query(SET_TAGS)
                        .bind(study_id)
                        .bind(trial_id)
                        .bind(to_json(tags)?)
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                }
                if let Some(attrs) = &update.user_attrs {
                    for (name, value) in attrs {
                        if value.is_null() {
                            sqlx::query(DELETE_USER_ATTR)
                                .bind(study_id)
                                .bind(trial_id)
                                .bind(name)
                                .execute(&mut *tx)
                                .await?;
                        } else {
                            sqlx::query(SET_USER_ATTR)
                                .bind(study_id)
                                .bind(trial_id)
                                .bind(name)
                                .bind(value.to_string())
                                .execute(&mut *tx)
                                .await?;
                        }
                    }
                    let (count,): (i64,) = sqlx::query_as(COUNT_USER_ATTRS)
                        .bind(study_id)
                        .bind(trial_id)
                        .fetch_one(&mut *tx)
                        .await?;
                    if usize::try_from(count).unwrap_or(usize::MAX) > max_user_attrs {
                        tx.rollback().await?;
                        return Ok(false);
                    }
                }
                tx.commit()
                    .await
                    .map_err($crate::store::StoreError::after_sending)?;
                Ok(true)
            }

            #[tracing::instrument(skip_all)]
            async fn begin_studies(&self) -> StoreResult<Box<dyn StudiesTx>> {
                Ok($studies::begin(self))
            }

            #[tracing::instrument(skip_all)]
            async fn insert_token(
                &self,
                name: &str,
                token_hash: &str,
                scope: Option<TrialKey>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<()> {
                token_query(INSERT_TOKEN, name, token_hash, scope, now)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn find_token(&self, token_hash: &str) -> StoreResult<Option<TokenRecord>> {
                let row: Option<TokenRow> = sqlx::query_as(FIND_TOKEN)
                    .bind(token_hash)
                    .fetch_optional(&self.pool)
                    .await?;
                row.map(TokenRecord::try_from).transpose()
            }

            #[tracing::instrument(skip_all)]
            async fn insert_role_token(
                &self,
                name: &str,
                token_hash: &str,
                role: $crate::model::Role,
                expires_at: Option<chrono::DateTime<chrono::Utc>>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<bool> {
                let mut conn = self.pool.acquire().await?;
                let done = sqlx::query(INSERT_ROLE_TOKEN)
                    .bind(name)
                    .bind(token_hash)
                    .bind(role.as_str())
                    .bind(expires_at)
                    .bind(now)
                    .execute(&mut *conn)
                    .await;
                match done {
                    Ok(_) => Ok(true),
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(false),
                    Err(e) => Err($crate::store::StoreError::after_sending(e)),
                }
            }

            #[tracing::instrument(skip_all)]
            async fn list_tokens(&self) -> StoreResult<Vec<TokenRecord>> {
                let rows: Vec<TokenRow> = sqlx::query_as(LIST_TOKENS).fetch_all(&self.pool).await?;
                rows.into_iter().map(TokenRecord::try_from).collect()
            }

            #[tracing::instrument(skip_all)]
            async fn touch_token(
                &self,
                name: &str,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<()> {
                sqlx::query(TOUCH_TOKEN)
                    .bind(name)
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn insert_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
                sqlx::query(INSERT_AUDIT)
                    .bind(entry.at)
                    .bind(&entry.actor)
                    .bind(&entry.action)
                    .bind(entry.study_id)
                    .bind(entry.trial_id)
                    .bind(&entry.detail)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn list_audit(&self, after_id: i64, limit: i64) -> StoreResult<Vec<AuditRecord>> {
                let rows: Vec<AuditRow> = sqlx::query_as(LIST_AUDIT)
                    .bind(after_id)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            #[tracing::instrument(skip_all)]
            async fn insert_delivery(&self, delivery: &NewDelivery) -> StoreResult<i64> {
                let id: i64 = sqlx::query_scalar(INSERT_DELIVERY)
                    .bind(delivery.study_id)
                    .bind(&delivery.event)
                    .bind(delivery.trial_id)
                    .bind(&delivery.target)
                    .bind(&delivery.url)
                    .bind(delivery.created_at)
                    .fetch_one(&self.pool)
                    .await?;
                Ok(id)
            }

            #[tracing::instrument(skip_all)]
            async fn update_delivery(
                &self,
                id: i64,
                progress: &DeliveryProgress,
            ) -> StoreResult<()> {
                sqlx::query(UPDATE_DELIVERY)
                    .bind(id)
                    .bind(&progress.state)
                    .bind(progress.attempts)
                    .bind(progress.last_status)
                    .bind(&progress.last_error)
                    .bind(progress.updated_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn list_deliveries(
                &self,
                study_id: StudyId,
                after_id: i64,
                limit: i64,
            ) -> StoreResult<Vec<DeliveryRecord>> {
                let rows: Vec<DeliveryRow> = sqlx::query_as(LIST_DELIVERIES)
                    .bind(study_id)
                    .bind(after_id)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(rows.into_iter().map(Into::into).collect())
            }

            #[tracing::instrument(skip_all)]
            async fn claim_runner(
                &self,
                study_id: StudyId,
                owner: &str,
                now: chrono::DateTime<chrono::Utc>,
                ttl: chrono::Duration,
            ) -> StoreResult<bool> {
                let done = sqlx::query(CLAIM_RUNNER)
                    .bind(study_id)
                    .bind(owner)
                    .bind(now + ttl)
                    .bind(now)
                    .execute(&self.pool)
                    .await;
                match done {
                    Ok(done) => Ok(done.rows_affected() == 1),
                    // The study was deleted meanwhile.
                    Err(sqlx::Error::Database(e)) if e.is_foreign_key_violation() => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }

            #[tracing::instrument(skip_all)]
            async fn release_runner(&self, study_id: StudyId, owner: &str) -> StoreResult<()> {
                sqlx::query(RELEASE_RUNNER)
                    .bind(study_id)
                    .bind(owner)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn renew_replica(
                &self,
                replica: &ReplicaRecord,
                now: chrono::DateTime<chrono::Utc>,
                ttl: chrono::Duration,
            ) -> StoreResult<Vec<ReplicaRecord>> {
                sqlx::query(RENEW_REPLICA)
                    .bind(&replica.id)
                    .bind(&replica.url)
                    .bind(now + ttl)
                    .execute(&self.pool)
                    .await?;
                sqlx::query(FORGET_REPLICAS)
                    .bind(now - chrono::Duration::minutes(1))
                    .execute(&self.pool)
                    .await?;
                let live: Vec<(String, String)> = sqlx::query_as(LIVE_REPLICAS)
                    .bind(now)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(live
                    .into_iter()
                    .map(|(id, url)| ReplicaRecord { id, url })
                    .collect())
            }

            #[tracing::instrument(skip_all)]
            async fn report_pool_worker(
                &self,
                report: &PoolWorkerReport,
                now_ms: i64,
                max_gap_ms: i64,
            ) -> StoreResult<()> {
                let minute_ms = now_ms - now_ms.rem_euclid(60_000);
                // One commit for both (the first statement writes, so SQLite takes its
                // write lock at once: no read-to-write upgrade to deadlock on).
                let mut tx = self.pool.begin().await?;
                sqlx::query(ADD_POOL_USAGE)
                    .bind(&report.pool)
                    .bind(&report.worker)
                    .bind(minute_ms)
                    .bind(now_ms)
                    .bind(max_gap_ms)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(REPORT_POOL_WORKER)
                    .bind(&report.pool)
                    .bind(&report.worker)
                    .bind(&report.host)
                    .bind(report.slots)
                    .bind(&report.gpus)
                    .bind(report.busy)
                    .bind(now_ms)
                    .bind(max_gap_ms)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn list_pool_workers(
                &self,
                pool: Option<&str>,
            ) -> StoreResult<Vec<PoolWorkerRecord>> {
                Ok(match pool {
                    Some(pool) => {
                        sqlx::query_as(LIST_WORKERS_OF_POOL)
                            .bind(pool)
                            .fetch_all(&self.pool)
                            .await?
                    }
                    None => {
                        sqlx::query_as(LIST_POOL_WORKERS)
                            .fetch_all(&self.pool)
                            .await?
                    }
                })
            }

            #[tracing::instrument(skip_all)]
            async fn list_pool_usage(
                &self,
                pool: &str,
                since_ms: i64,
            ) -> StoreResult<Vec<PoolUsageRecord>> {
                Ok(sqlx::query_as(LIST_POOL_USAGE)
                    .bind(pool)
                    .bind(since_ms)
                    .fetch_all(&self.pool)
                    .await?)
            }

            #[tracing::instrument(skip_all)]
            async fn remove_replica(&self, id: &str) -> StoreResult<()> {
                sqlx::query(REMOVE_REPLICA)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn replica_secret(&self, candidate: &str) -> StoreResult<String> {
                sqlx::query(OFFER_REPLICA_SECRET)
                    .bind(candidate)
                    .execute(&self.pool)
                    .await?;
                let (secret,): (String,) =
                    sqlx::query_as(REPLICA_SECRET).fetch_one(&self.pool).await?;
                Ok(secret)
            }

            #[tracing::instrument(skip_all)]
            async fn replace_token(
                &self,
                name: &str,
                token_hash: &str,
                scope: Option<TrialKey>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<()> {
                token_query(REPLACE_TOKEN, name, token_hash, scope, now)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            #[tracing::instrument(skip_all)]
            async fn delete_token(&self, name: &str) -> StoreResult<bool> {
                let mut conn = self.pool.acquire().await?;
                let done = sqlx::query(DELETE_TOKEN)
                    .bind(name)
                    .execute(&mut *conn)
                    .await
                    .map_err($crate::store::StoreError::after_sending)?;
                Ok(done.rows_affected() > 0)
            }

            #[tracing::instrument(skip_all)]
            async fn count_tokens(&self) -> StoreResult<i64> {
                let (n,): (i64,) = sqlx::query_as(COUNT_TOKENS).fetch_one(&self.pool).await?;
                Ok(n)
            }
        }
    };
}
pub(super) use impl_sql_store;

/// The batch writes of a study transaction as one statement per row: for SQLite, where a
/// statement costs a function call, not a network round trip. `$tx` is the struct
/// `impl_sql_store!` defined.
macro_rules! impl_row_writes {
    ($tx:ident) => {
        impl $tx {
            async fn write_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
                for t in trials {
                    sqlx::query(UPSERT_TRIAL)
                        .bind(t.study_id)
                        .bind(t.id)
                        .bind(t.state.as_str())
                        .bind(to_json(&t.parameters)?)
                        .bind(&t.client_id)
                        .bind(t.final_measurement.as_ref().map(to_json).transpose()?)
                        .bind(t.objective)
                        .bind(&t.infeasible_reason)
                        .bind(&t.fail_reason)
                        .bind(t.early_stopped)
                        .bind(t.excluded)
                        .bind(t.lease_expires_at)
                        .bind(t.created_at)
                        .bind(t.started_at)
                        .bind(t.completed_at)
                        .bind(t.change_seq)
                        .bind(i32::try_from(t.attempts).unwrap_or(i32::MAX))
                        .bind(t.budget)
                        .bind(t.lineage.as_ref().map(to_json).transpose()?)
                        .execute(&mut *self.tx)
                        .await?;
                }
                Ok(())
            }

            async fn write_measurements(
                &mut self,
                rows: &[(TrialId, Measurement)],
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<()> {
                for (trial_id, m) in rows {
                    sqlx::query(UPSERT_MEASUREMENT)
                        .bind(self.study.id)
                        .bind(trial_id)
                        .bind(m.step)
                        .bind(m.elapsed_secs)
                        .bind(to_json(&m.metrics)?)
                        .bind(now)
                        .execute(&mut *self.tx)
                        .await?;
                }
                Ok(())
            }
        }
    };
}
pub(super) use impl_row_writes;

/// The study transactions of a backend where a statement is cheap (SQLite: a function call,
/// no network): `$begin` (an expression over `$s: &$store`) opens the transaction at the
/// first lock and takes the database's one write lock, so every study is locked with it and
/// `$lock` only reads the study row; each row of a batch is written by its own statement.
macro_rules! impl_row_study_tx {
    ($store:ty, $studies:ident, $tx:ident, $db:ty, $lock:expr, |$s:ident| $begin:expr) => {
        pub struct $studies {
            pool: sqlx::Pool<$db>,
            tx: Option<sqlx::Transaction<'static, $db>>,
        }

        impl $studies {
            fn begin(store: &$store) -> Box<dyn StudiesTx> {
                Box::new($studies {
                    pool: store.pool.clone(),
                    tx: None,
                })
            }
        }

        #[async_trait::async_trait]
        impl StudiesTx for $studies {
            async fn lock_study(
                self: Box<Self>,
                study_id: StudyId,
                _wait: bool,
            ) -> StoreResult<StudyLock> {
                let $studies { pool, tx } = *self;
                let mut tx = match tx {
                    Some(tx) => tx,
                    None => {
                        let $s = &pool;
                        $begin.await?
                    }
                };
                let row: Option<StudyRow> = sqlx::query_as($lock)
                    .bind(study_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                match row {
                    None => Ok(StudyLock::Missing(Box::new($studies {
                        pool,
                        tx: Some(tx),
                    }))),
                    Some(row) => Ok(StudyLock::Locked(Box::new($tx {
                        pool,
                        tx,
                        study: row.try_into()?,
                    }))),
                }
            }

            async fn commit(self: Box<Self>) -> StoreResult<()> {
                if let Some(tx) = self.tx {
                    tx.commit().await?;
                }
                Ok(())
            }
        }

        pub struct $tx {
            pool: sqlx::Pool<$db>,
            tx: sqlx::Transaction<'static, $db>,
            study: StudyRecord,
        }

        $crate::store::sql::impl_row_writes!($tx);

        #[async_trait::async_trait]
        impl StudyTx for $tx {
            fn study(&self) -> &StudyRecord {
                &self.study
            }

            async fn unfinished_trials(&mut self) -> StoreResult<Vec<TrialRecord>> {
                let rows: Vec<TrialRow> = sqlx::query_as(UNFINISHED_TRIALS)
                    .bind(self.study.id)
                    .fetch_all(&mut *self.tx)
                    .await?;
                trials_from(rows)
            }

            async fn runner_lease(
                &mut self,
            ) -> StoreResult<Option<(String, chrono::DateTime<chrono::Utc>)>> {
                Ok(sqlx::query_as(RUNNER_LEASE)
                    .bind(self.study.id)
                    .fetch_optional(&mut *self.tx)
                    .await?)
            }

            async fn paused_trials(&mut self) -> StoreResult<Vec<TrialRecord>> {
                let rows: Vec<TrialRow> = sqlx::query_as(PAUSED_TRIALS)
                    .bind(self.study.id)
                    .fetch_all(&mut *self.tx)
                    .await?;
                trials_from(rows)
            }

            async fn trials_by_id(&mut self, ids: &[TrialId]) -> StoreResult<Vec<TrialRecord>> {
                let mut out = Vec::with_capacity(ids.len());
                for id in ids {
                    let row: Option<TrialRow> = sqlx::query_as(GET_TRIAL)
                        .bind(self.study.id)
                        .bind(id)
                        .fetch_optional(&mut *self.tx)
                        .await?;
                    if let Some(row) = row {
                        out.push(row.try_into()?);
                    }
                }
                Ok(out)
            }

            async fn completed_objectives(
                &mut self,
            ) -> StoreResult<Vec<(TrialId, f64, chrono::DateTime<chrono::Utc>)>> {
                Ok(sqlx::query_as(COMPLETED_OBJECTIVES)
                    .bind(self.study.id)
                    .fetch_all(&mut *self.tx)
                    .await?)
            }

            async fn count_failed(&mut self) -> StoreResult<u64> {
                let (n,): (i64,) = sqlx::query_as(COUNT_FAILED)
                    .bind(self.study.id)
                    .fetch_one(&mut *self.tx)
                    .await?;
                Ok(n.max(0) as u64)
            }

            async fn measurements(&mut self, trial_id: TrialId) -> StoreResult<Vec<Measurement>> {
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

            // How a batch's rows are written differs by backend: one statement per row here
            // on SQLite (`impl_row_writes!`), one bulk UNNEST statement each on PostgreSQL.
            async fn insert_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
                self.write_trials(trials).await
            }

            async fn update_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
                self.write_trials(trials).await
            }

            async fn upsert_measurements(
                &mut self,
                rows: &[(TrialId, Measurement)],
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<()> {
                self.write_measurements(rows, now).await
            }

            async fn update_study(&mut self, study: &StudyRecord) -> StoreResult<()> {
                let counts = study.trial_counts.columns();
                sqlx::query(UPDATE_STUDY)
                    .bind(study.id)
                    .bind(study.state.as_str())
                    .bind(&study.state_reason)
                    .bind(to_json(&study.spec)?)
                    .bind(study.next_trial_id)
                    .bind(study.updated_at)
                    .bind(study.change_seq)
                    .bind(counts[0])
                    .bind(counts[1])
                    .bind(counts[2])
                    .bind(counts[3])
                    .bind(counts[4])
                    .bind(counts[5])
                    .bind(counts[6])
                    .execute(&mut *self.tx)
                    .await?;
                Ok(())
            }

            async fn revoke_trial_tokens(&mut self, trial_ids: &[TrialId]) -> StoreResult<()> {
                for trial_id in trial_ids {
                    sqlx::query(DELETE_TRIAL_TOKEN)
                        .bind(self.study.id)
                        .bind(trial_id)
                        .execute(&mut *self.tx)
                        .await?;
                }
                Ok(())
            }

            async fn replace_trial_tokens(
                &mut self,
                tokens: &[TrialToken],
                now: chrono::DateTime<chrono::Utc>,
            ) -> StoreResult<()> {
                for t in tokens {
                    let scope = Some(TrialKey::new(self.study.id, t.trial_id));
                    token_query(REPLACE_TOKEN, &t.name, &t.hash, scope, now)
                        .execute(&mut *self.tx)
                        .await?;
                }
                Ok(())
            }

            async fn release(self: Box<Self>) -> StoreResult<Box<dyn StudiesTx>> {
                let $tx { pool, tx, .. } = *self;
                Ok(Box::new($studies { pool, tx: Some(tx) }))
            }

            async fn commit(self: Box<Self>) -> StoreResult<()> {
                self.tx.commit().await?;
                Ok(())
            }
        }
    };
}
pub(super) use impl_row_study_tx;
