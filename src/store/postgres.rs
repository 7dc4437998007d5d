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

// A batch's rows go in one statement each, whatever the batch size: every row of a batch
// costs a network round trip otherwise, and the study's lock is held across all of them.
// Each column travels as one array; `UNNEST` zips them back into rows.

/// Inserts a batch's new trials.
const INSERT_TRIALS: &str = "INSERT INTO trials (study_id, id, state, parameters, client_id, \
     final_measurement, objective, infeasible_reason, fail_reason, early_stopped, excluded, \
     lease_expires_at, created_at, started_at, completed_at, change_seq) \
     SELECT $1, * FROM UNNEST($2::bigint[], $3::text[], $4::jsonb[], $5::text[], $6::jsonb[], \
     $7::float8[], $8::text[], $9::text[], $10::bool[], $11::bool[], $12::timestamptz[], \
     $13::timestamptz[], $14::timestamptz[], $15::timestamptz[], $16::bigint[])";

/// Writes every mutable column of a batch's changed trials.
const UPDATE_TRIALS: &str = "UPDATE trials AS t SET state = u.state, parameters = u.parameters, \
     client_id = u.client_id, final_measurement = u.final_measurement, objective = u.objective, \
     infeasible_reason = u.infeasible_reason, fail_reason = u.fail_reason, \
     early_stopped = u.early_stopped, excluded = u.excluded, lease_expires_at = u.lease_expires_at, \
     started_at = u.started_at, completed_at = u.completed_at, change_seq = u.change_seq \
     FROM UNNEST($2::bigint[], $3::text[], $4::jsonb[], $5::text[], $6::jsonb[], $7::float8[], \
     $8::text[], $9::text[], $10::bool[], $11::bool[], $12::timestamptz[], $13::timestamptz[], \
     $14::timestamptz[], $15::bigint[]) AS u(id, state, parameters, client_id, final_measurement, \
     objective, infeasible_reason, fail_reason, early_stopped, excluded, lease_expires_at, \
     started_at, completed_at, change_seq) \
     WHERE t.study_id = $1 AND t.id = u.id";

/// Inserts a batch's measurements, replacing any at the same (trial, step).
const UPSERT_MEASUREMENTS: &str = "INSERT INTO measurements \
     (study_id, trial_id, step, elapsed_secs, metrics, created_at) \
     SELECT $1, u.trial_id, u.step, u.elapsed_secs, u.metrics, $6 \
     FROM UNNEST($2::bigint[], $3::bigint[], $4::float8[], $5::jsonb[]) \
     AS u(trial_id, step, elapsed_secs, metrics) \
     ON CONFLICT (study_id, trial_id, step) DO UPDATE SET elapsed_secs = excluded.elapsed_secs, \
     metrics = excluded.metrics, created_at = excluded.created_at";

type Jsonb = sqlx::types::Json<serde_json::Value>;
type Time = chrono::DateTime<chrono::Utc>;

/// A batch of trials, column by column.
#[derive(Default)]
struct TrialColumns {
    id: Vec<i64>,
    state: Vec<&'static str>,
    parameters: Vec<Jsonb>,
    client_id: Vec<Option<String>>,
    final_measurement: Vec<Option<Jsonb>>,
    objective: Vec<Option<f64>>,
    infeasible_reason: Vec<Option<String>>,
    fail_reason: Vec<Option<String>>,
    early_stopped: Vec<bool>,
    excluded: Vec<bool>,
    lease_expires_at: Vec<Option<Time>>,
    created_at: Vec<Time>,
    started_at: Vec<Option<Time>>,
    completed_at: Vec<Option<Time>>,
    change_seq: Vec<i64>,
}

impl TrialColumns {
    fn of(trials: &[TrialRecord]) -> StoreResult<Self> {
        let mut c = TrialColumns::default();
        for t in trials {
            c.id.push(t.id);
            c.state.push(t.state.as_str());
            c.parameters.push(to_json(&t.parameters)?);
            c.client_id.push(t.client_id.clone());
            c.final_measurement.push(t.final_measurement.as_ref().map(to_json).transpose()?);
            c.objective.push(t.objective);
            c.infeasible_reason.push(t.infeasible_reason.clone());
            c.fail_reason.push(t.fail_reason.clone());
            c.early_stopped.push(t.early_stopped);
            c.excluded.push(t.excluded);
            c.lease_expires_at.push(t.lease_expires_at);
            c.created_at.push(t.created_at);
            c.started_at.push(t.started_at);
            c.completed_at.push(t.completed_at);
            c.change_seq.push(t.change_seq);
        }
        Ok(c)
    }
}

impl PostgresStudyTx {
    async fn write_new_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
        if trials.is_empty() {
            return Ok(());
        }
        let c = TrialColumns::of(trials)?;
        sqlx::query(INSERT_TRIALS)
            .bind(self.study.id)
            .bind(c.id)
            .bind(c.state)
            .bind(c.parameters)
            .bind(c.client_id)
            .bind(c.final_measurement)
            .bind(c.objective)
            .bind(c.infeasible_reason)
            .bind(c.fail_reason)
            .bind(c.early_stopped)
            .bind(c.excluded)
            .bind(c.lease_expires_at)
            .bind(c.created_at)
            .bind(c.started_at)
            .bind(c.completed_at)
            .bind(c.change_seq)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn write_changed_trials(&mut self, trials: &[TrialRecord]) -> StoreResult<()> {
        if trials.is_empty() {
            return Ok(());
        }
        let c = TrialColumns::of(trials)?;
        sqlx::query(UPDATE_TRIALS)
            .bind(self.study.id)
            .bind(c.id)
            .bind(c.state)
            .bind(c.parameters)
            .bind(c.client_id)
            .bind(c.final_measurement)
            .bind(c.objective)
            .bind(c.infeasible_reason)
            .bind(c.fail_reason)
            .bind(c.early_stopped)
            .bind(c.excluded)
            .bind(c.lease_expires_at)
            .bind(c.started_at)
            .bind(c.completed_at)
            .bind(c.change_seq)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }

    async fn write_measurements(&mut self, rows: &[(i64, Measurement)], now: Time) -> StoreResult<()> {
        // One statement may not touch a row twice: of two at one (trial, step), the later wins,
        // as it would row by row.
        let mut latest: std::collections::BTreeMap<(i64, i64), &Measurement> = Default::default();
        for (trial_id, m) in rows {
            latest.insert((*trial_id, m.step), m);
        }
        if latest.is_empty() {
            return Ok(());
        }
        let (mut trial_ids, mut steps, mut elapsed, mut metrics) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for ((trial_id, step), m) in latest {
            trial_ids.push(trial_id);
            steps.push(step);
            elapsed.push(m.elapsed_secs);
            metrics.push(to_json(&m.metrics)?);
        }
        sqlx::query(UPSERT_MEASUREMENTS)
            .bind(self.study.id)
            .bind(trial_ids)
            .bind(steps)
            .bind(elapsed)
            .bind(metrics)
            .bind(now)
            .execute(&mut *self.tx)
            .await?;
        Ok(())
    }
}
