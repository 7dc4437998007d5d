//! A transaction's writes to its studies, sent as one statement: each kind of row travels as
//! one array per column, which `UNNEST` zips back into rows. The columns of each kind are
//! declared once (`row_batch!`); the placeholders are numbered by sqlx's `QueryBuilder` as the
//! arrays are bound, so a placeholder and its value cannot drift apart.

use sqlx::{Postgres, QueryBuilder};

use super::super::records::to_json;
use super::super::{StoreResult, StudyRecord, TrialRecord, TrialToken};
use crate::model::{Measurement, StudyId, TrialId, TrialKey};

pub(super) type Jsonb = sqlx::types::Json<serde_json::Value>;
pub(super) type Time = chrono::DateTime<chrono::Utc>;

/// Declares a batch of rows sent column by column: the columns (name, Rust type, SQL type,
/// and the value a row gives), how a row fills them, and the `UNNEST` they are sent as.
macro_rules! row_batch {
    ($(#[$doc:meta])* $batch:ident for $row:ident: $item:ty {
        $($column:ident: $rust:ty as $sql:literal = $value:expr,)*
    }) => {
        $(#[$doc])*
        #[derive(Default)]
        struct $batch {
            $($column: Vec<$rust>,)*
        }

        impl $batch {
            const COLUMNS: &[&str] = &[$(stringify!($column)),*];

            fn push(&mut self, $row: $item) -> StoreResult<()> {
                $(self.$column.push($value);)*
                Ok(())
            }

            /// `UNNEST($n::type[], …) AS u(column, …)`, binding the columns in order.
            fn push_unnest(self, query: &mut QueryBuilder<Postgres>) {
                query.push("UNNEST(");
                let mut columns = query.separated(", ");
                $(columns.push_bind(self.$column).push_unseparated(concat!("::", $sql, "[]"));)*
                query.push(") AS u(").push(Self::COLUMNS.join(", ")).push(")");
            }
        }
    };
}

row_batch! {
    /// Trials, every column (in `sql::trial_cols!`'s order).
    TrialRows for t: &TrialRecord {
        study_id: StudyId as "bigint" = t.study_id,
        id: TrialId as "bigint" = t.id,
        state: &'static str as "text" = t.state.as_str(),
        parameters: Jsonb as "jsonb" = to_json(&t.parameters)?,
        client_id: Option<String> as "text" = t.client_id.clone(),
        final_measurement: Option<Jsonb> as "jsonb" =
            t.final_measurement.as_ref().map(to_json).transpose()?,
        objective: Option<f64> as "float8" = t.objective,
        infeasible_reason: Option<String> as "text" = t.infeasible_reason.clone(),
        fail_reason: Option<String> as "text" = t.fail_reason.clone(),
        early_stopped: bool as "bool" = t.early_stopped,
        excluded: bool as "bool" = t.excluded,
        lease_expires_at: Option<Time> as "timestamptz" = t.lease_expires_at,
        created_at: Time as "timestamptz" = t.created_at,
        started_at: Option<Time> as "timestamptz" = t.started_at,
        completed_at: Option<Time> as "timestamptz" = t.completed_at,
        change_seq: i64 as "bigint" = t.change_seq,
        attempts: i32 as "int" = i32::try_from(t.attempts).unwrap_or(i32::MAX),
        budget: Option<f64> as "float8" = t.budget,
        lineage: Option<Jsonb> as "jsonb" = t.lineage.as_ref().map(to_json).transpose()?,
    }
}

row_batch! {
    /// Measurements: (study, trial, measurement, when).
    MeasurementRows for m: (StudyId, TrialId, &Measurement, Time) {
        study_id: StudyId as "bigint" = m.0,
        trial_id: TrialId as "bigint" = m.1,
        step: i64 as "bigint" = m.2.step,
        elapsed_secs: Option<f64> as "float8" = m.2.elapsed_secs,
        metrics: Jsonb as "jsonb" = to_json(&m.2.metrics)?,
        created_at: Time as "timestamptz" = m.3,
    }
}

row_batch! {
    /// Trials whose tokens go.
    RevokedRows for r: TrialKey {
        study_id: StudyId as "bigint" = r.study,
        trial_id: TrialId as "bigint" = r.trial,
    }
}

row_batch! {
    /// Trial tokens issued (replacing any of their name): (token, study, when).
    TokenRows for k: (&TrialToken, StudyId, Time) {
        name: String as "text" = k.0.name.clone(),
        token_hash: String as "text" = k.0.hash.clone(),
        study_id: StudyId as "bigint" = k.1,
        trial_id: TrialId as "bigint" = k.0.trial_id,
        created_at: Time as "timestamptz" = k.2,
    }
}

row_batch! {
    /// Study rows: what a batch changes, with the ids of the unfinished trials (as array text:
    /// arrays of arrays must be rectangular) and the trial counts.
    StudyRows for w: &StudyWrites {
        id: StudyId as "bigint" = w.study.id,
        state: &'static str as "text" = w.study.state.as_str(),
        state_reason: Option<String> as "text" = w.study.state_reason.clone(),
        spec: Jsonb as "jsonb" = to_json(&w.study.spec)?,
        next_trial_id: TrialId as "bigint" = w.study.next_trial_id,
        updated_at: Time as "timestamptz" = w.study.updated_at,
        change_seq: i64 as "bigint" = w.study.change_seq,
        unfinished_ids: String as "text" = array_text(&w.unfinished_ids),
        n_requested: i64 as "bigint" = count(w.study.trial_counts.requested),
        n_active: i64 as "bigint" = count(w.study.trial_counts.active),
        n_stopping: i64 as "bigint" = count(w.study.trial_counts.stopping),
        n_completed: i64 as "bigint" = count(w.study.trial_counts.completed),
        n_infeasible: i64 as "bigint" = count(w.study.trial_counts.infeasible),
        n_failed: i64 as "bigint" = count(w.study.trial_counts.failed),
        n_paused: i64 as "bigint" = count(w.study.trial_counts.paused),
    }
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `{1,2,3}`, PostgreSQL's text form of an array.
fn array_text(ids: &[TrialId]) -> String {
    let ids: Vec<String> = ids.iter().map(TrialId::to_string).collect();
    format!("{{{}}}", ids.join(","))
}

/// `column = u.column, …` for every column but the keys; `casts` give a column's type where
/// the batch sends it as another.
fn assignments(columns: &[&str], keys: &[&str], casts: &[(&str, &str)]) -> String {
    let assigned = columns.iter().filter(|c| !keys.contains(c)).map(|c| {
        match casts.iter().find(|(name, _)| name == c) {
            Some((_, to)) => format!("{c} = CAST(u.{c} AS {to})"),
            None => format!("{c} = u.{c}"),
        }
    });
    assigned.collect::<Vec<_>>().join(", ")
}

/// One study's writes, ready to be sent with other studies' (`write_studies`).
pub(super) struct StudyWrites {
    pub study: StudyRecord,
    pub unfinished_ids: Vec<TrialId>,
    pub new_trials: Vec<TrialRecord>,
    pub changed_trials: Vec<TrialRecord>,
    /// At most one per (trial, step): one statement may not touch a row twice.
    pub measurements: Vec<(TrialId, Measurement)>,
    pub measured_at: Time,
    pub revoked: Vec<TrialId>,
    /// At most one per name.
    pub tokens: Vec<TrialToken>,
    pub tokens_at: Time,
}

/// Send `writes` (of distinct studies) as one statement: new trials, changed trials (every
/// mutable column), measurements (replacing any at the same trial and step), the tokens of
/// trials that finished (deleted) or were launched (replaced), and each study row. The parts
/// touch different rows, as data-modifying CTEs must.
///
/// The changed trials (and revoked tokens) are found by primary key, row by row, whatever the
/// statistics say: the keys come from behind an `OFFSET 0` fence, so there is no
/// `study_id = $1` for the planner to scan a whole study with. (While a study grows faster
/// than autovacuum analyzes the table, the statistics say the study has a handful of trials,
/// and such a scan made each batch O(trials): throughput fell from ~3,600 to ~800 trials/s at
/// 30,000.) Nor may a plan cached while the table was small (see `BEGIN`).
pub(super) async fn write_studies(
    tx: &mut sqlx::Transaction<'static, Postgres>,
    writes: &[StudyWrites],
) -> StoreResult<()> {
    if writes.is_empty() {
        return Ok(());
    }
    let (mut new, mut changed) = (TrialRows::default(), TrialRows::default());
    let (mut measured, mut revoked) = (MeasurementRows::default(), RevokedRows::default());
    let (mut issued, mut studies) = (TokenRows::default(), StudyRows::default());
    for w in writes {
        let id = w.study.id;
        w.new_trials.iter().try_for_each(|t| new.push(t))?;
        w.changed_trials.iter().try_for_each(|t| changed.push(t))?;
        for (trial_id, m) in &w.measurements {
            measured.push((id, *trial_id, m, w.measured_at))?;
        }
        w.revoked
            .iter()
            .try_for_each(|t| revoked.push(TrialKey::new(id, *t)))?;
        w.tokens
            .iter()
            .try_for_each(|k| issued.push((k, id, w.tokens_at)))?;
        studies.push(w)?;
    }
    let trial_columns = TrialRows::COLUMNS.join(", ");
    let mut q = QueryBuilder::new("WITH new_trials AS (INSERT INTO trials (");
    q.push(&trial_columns).push(") SELECT * FROM ");
    new.push_unnest(&mut q);
    q.push("), changed_trials AS (UPDATE trials AS t SET ");
    q.push(assignments(
        TrialRows::COLUMNS,
        &["study_id", "id", "created_at"],
        &[],
    ));
    q.push(" FROM (SELECT * FROM ");
    changed.push_unnest(&mut q);
    q.push(" OFFSET 0) AS u WHERE t.study_id = u.study_id AND t.id = u.id), measured AS (");
    q.push("INSERT INTO measurements (")
        .push(MeasurementRows::COLUMNS.join(", "));
    q.push(") SELECT * FROM ");
    measured.push_unnest(&mut q);
    q.push(
        " ON CONFLICT (study_id, trial_id, step) DO UPDATE SET \
         elapsed_secs = excluded.elapsed_secs, metrics = excluded.metrics, \
         created_at = excluded.created_at), revoked AS (DELETE FROM api_tokens AS a USING \
         (SELECT * FROM ",
    );
    revoked.push_unnest(&mut q);
    q.push(
        " OFFSET 0) AS r WHERE a.study_id = r.study_id AND a.trial_id = r.trial_id), \
         issued AS (INSERT INTO api_tokens (",
    );
    q.push(TokenRows::COLUMNS.join(", "))
        .push(") SELECT * FROM ");
    issued.push_unnest(&mut q);
    q.push(
        " ON CONFLICT (name) DO UPDATE SET token_hash = excluded.token_hash, \
         study_id = excluded.study_id, trial_id = excluded.trial_id, \
         created_at = excluded.created_at) UPDATE studies AS s SET ",
    );
    let bigints = [("unfinished_ids", "bigint[]")];
    q.push(assignments(StudyRows::COLUMNS, &["id"], &bigints));
    q.push(" FROM ");
    studies.push_unnest(&mut q);
    q.push(" WHERE s.id = u.id");
    q.build().execute(&mut **tx).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trial_batch_has_the_columns_trials_are_read_with() {
        let read: Vec<&str> = crate::store::sql::trial_cols!().split(", ").collect();
        assert_eq!(TrialRows::COLUMNS, read.as_slice());
    }

    #[test]
    fn assignments_skip_the_keys_and_cast_what_travels_as_another_type() {
        let set = assignments(&["id", "a", "ids"], &["id"], &[("ids", "bigint[]")]);
        assert_eq!(set, "a = u.a, ids = CAST(u.ids AS bigint[])");
    }
}
