//! Optuna's storage (`optuna.storages.GrpcStorageProxy`, served by `api/optuna/`) over
//! Augur's studies and trials.

use std::collections::BTreeMap;

use augur_optimizer::Value;
use chrono::{DateTime, Utc};
use serde_json::{Value as JsonValue, json};

use super::state_machine::{Command, OptunaChange, Reply};
use super::{
    Caller, InternalError, Service, ServiceError, ServiceResult, not_found_study, unexpected,
};
use crate::model::{
    AnnotationUpdate, Annotations, Measurement, StudyId, StudySpec, Trial, TrialId, TrialState,
};

/// The one parameter of an Optuna study's spec: it marks the study as Optuna's.
///
/// Optuna's storage (`optuna.storages.GrpcStorageProxy`, served by `api/optuna/`) over
/// Augur's studies and trials. An Optuna study is an Augur study whose search space is the
/// one marker parameter [`MARKER_PARAMETER`] (a spec needs one; Optuna's trials bring their
/// own distributions) and whose metrics are its objectives (`value`, or `value_0`, `value_1`…).
/// Its trials are Augur trials created by the client: states, parameters (Optuna's internal
/// float), objective values (the final measurement) and intermediate values (measurements
/// by step) change in the study's batch, under its lock (`state_machine/optuna.rs`), so
/// several processes and replicas serialize as for any trial. Distributions and system
/// attributes are user attributes under reserved prefixes, beside Optuna's own user
/// attributes; they are written after the change they belong to, and a parameter whose
/// distribution is not written yet is not shown.
pub const MARKER_PARAMETER: &str = "optuna_storage";
/// User attributes under this prefix are Optuna's system attributes.
const SYSTEM_PREFIX: &str = "optuna:system:";
/// A trial's user attribute under this prefix is the distribution of the parameter named
/// after it (Optuna's JSON form, as a value).
const DISTRIBUTION_PREFIX: &str = "optuna:distribution:";
/// `GetTrials` scans from the oldest unfinished trial a client asks for when it is at most
/// this many trials below the newest it has.
const NEAR_SCAN: i64 = 256;
/// Optuna studies have no trial budget nor cap; Augur's spec needs both (this is its most).
const UNBOUNDED: i64 = 100_000_000;

/// A trial's state as Optuna names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptunaState {
    Running,
    Complete,
    Pruned,
    Fail,
    Waiting,
}

impl OptunaState {
    /// Augur's state for it; a pruned trial is a completed one that stopped early.
    pub(super) fn to_augur(self) -> (TrialState, bool) {
        match self {
            OptunaState::Running => (TrialState::Active, false),
            OptunaState::Complete => (TrialState::Completed, false),
            OptunaState::Pruned => (TrialState::Completed, true),
            OptunaState::Fail => (TrialState::Failed, false),
            OptunaState::Waiting => (TrialState::Requested, false),
        }
    }

    /// Optuna's name for an Augur trial's state (Augur's own states Optuna lacks read as
    /// the nearest: stopping and paused are running, infeasible failed).
    pub fn of(state: TrialState, early_stopped: bool) -> Self {
        match state {
            TrialState::Requested => OptunaState::Waiting,
            TrialState::Active | TrialState::Stopping | TrialState::Paused => OptunaState::Running,
            TrialState::Completed if early_stopped => OptunaState::Pruned,
            TrialState::Completed => OptunaState::Complete,
            TrialState::Infeasible | TrialState::Failed => OptunaState::Fail,
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(
            self,
            OptunaState::Complete | OptunaState::Pruned | OptunaState::Fail
        )
    }
}

/// A study as Optuna sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct OptunaStudy {
    pub id: StudyId,
    pub name: String,
    /// One per objective: true to maximize.
    pub maximize: Vec<bool>,
    pub user_attrs: BTreeMap<String, JsonValue>,
    pub system_attrs: BTreeMap<String, JsonValue>,
}

/// A trial as Optuna sees it. `number` is Optuna's (from 0); `id` Augur's (from 1).
#[derive(Debug, Clone, PartialEq)]
pub struct OptunaTrial {
    pub study_id: StudyId,
    pub id: TrialId,
    pub state: OptunaState,
    pub values: Option<Vec<f64>>,
    pub started_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    /// In the internal (float) form of their distribution.
    pub params: BTreeMap<String, f64>,
    pub distributions: BTreeMap<String, JsonValue>,
    pub user_attrs: BTreeMap<String, JsonValue>,
    pub system_attrs: BTreeMap<String, JsonValue>,
    pub intermediate_values: BTreeMap<i64, f64>,
}

impl OptunaTrial {
    pub fn number(&self) -> i64 {
        self.id.get() - 1
    }
}

/// What a new trial starts as: nothing (running, from now), or the client's template (an
/// enqueued or added trial); its `study_id` and `id` are ignored.
pub type OptunaTemplate = OptunaTrial;

/// The metric ids of a study with `objectives` objectives.
fn metric_ids(objectives: usize) -> Vec<String> {
    if objectives == 1 {
        vec!["value".to_string()]
    } else {
        (0..objectives).map(|i| format!("value_{i}")).collect()
    }
}

/// The spec of a new Optuna study.
pub fn optuna_spec(name: &str, maximize: &[bool]) -> ServiceResult<StudySpec> {
    if maximize.is_empty() {
        return Err(ServiceError::invalid(
            "directions",
            "a study needs at least one direction",
        ));
    }
    let metrics: Vec<JsonValue> = metric_ids(maximize.len())
        .into_iter()
        .zip(maximize)
        .map(|(id, max)| json!({"id": id, "goal": if *max { "maximize" } else { "minimize" }}))
        .collect();
    let spec = json!({
        "name": name,
        "algorithm": "random",
        "metrics": metrics,
        "parameters": [{"id": MARKER_PARAMETER, "type": "categorical", "values": ["grpc"]}],
        "max_trials": UNBOUNDED,
        "parallel_trials": UNBOUNDED,
        "fail_fast_trials": 0,
    });
    serde_json::from_value(spec)
        .map_err(|e| InternalError::data("the spec of an Optuna study", e).into())
}

fn is_optuna_spec(spec: &StudySpec) -> bool {
    spec.parameters.len() == 1 && spec.parameters[0].id == MARKER_PARAMETER
}

/// Augur user attributes split into Optuna's user attributes, system attributes and (of a
/// trial) distributions by their prefixes.
#[derive(Default)]
struct SplitAttrs {
    user: BTreeMap<String, JsonValue>,
    system: BTreeMap<String, JsonValue>,
    distributions: BTreeMap<String, JsonValue>,
}

fn split_attrs(attrs: BTreeMap<String, JsonValue>) -> SplitAttrs {
    let mut split = SplitAttrs::default();
    for (key, value) in attrs {
        if let Some(rest) = key.strip_prefix(SYSTEM_PREFIX) {
            split.system.insert(rest.to_string(), value);
        } else if let Some(rest) = key.strip_prefix(DISTRIBUTION_PREFIX) {
            split.distributions.insert(rest.to_string(), value);
        } else {
            split.user.insert(key, value);
        }
    }
    split
}

fn check_finite(values: &[f64], field: &str) -> ServiceResult<()> {
    if values.iter().all(|v| v.is_finite()) {
        Ok(())
    } else {
        Err(ServiceError::invalid(
            field,
            "Augur stores finite values only (no NaN nor infinity)",
        ))
    }
}

impl Service {
    /// A new Optuna study, or `None` when an Optuna study of that name exists: of several
    /// processes creating one name at once, one creates it and the others get `None`
    /// (Optuna's names are unique; Augur's own are not, so the store keeps Optuna's apart).
    pub async fn optuna_create_study(
        &self,
        actor: &Caller,
        name: &str,
        maximize: &[bool],
    ) -> ServiceResult<Option<StudyId>> {
        let study = self
            .create_optuna_study(actor, optuna_spec(name, maximize)?)
            .await?;
        Ok(study.map(|s| s.id))
    }

    /// The Optuna study of that name.
    pub async fn optuna_study_id(&self, name: &str) -> ServiceResult<Option<StudyId>> {
        Ok(self.store.optuna_study_id(name).await?)
    }

    /// One page of studies (Optuna's only) whose name contains `name`, and the next page's token.
    async fn list_optuna_page(
        &self,
        name: Option<&str>,
        token: Option<&str>,
    ) -> ServiceResult<(Vec<OptunaStudy>, Option<String>)> {
        let page = self.list_studies(None, name, Some(500), token).await?;
        let studies = page
            .items
            .into_iter()
            .filter(|s| is_optuna_spec(&s.spec))
            .map(|s| optuna_study(s.id, s.name, &s.spec, s.annotations))
            .collect();
        Ok((studies, page.next_page_token))
    }

    pub async fn optuna_studies(&self) -> ServiceResult<Vec<OptunaStudy>> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let (studies, next) = self.list_optuna_page(None, token.as_deref()).await?;
            all.extend(studies);
            match next {
                Some(next) => token = Some(next),
                None => return Ok(all),
            }
        }
    }

    pub async fn optuna_study(&self, study_id: StudyId) -> ServiceResult<OptunaStudy> {
        let record = self.study_record(study_id).await?;
        if !is_optuna_spec(&record.spec) {
            return Err(not_found_study(study_id));
        }
        let annotations = self
            .store
            .study_annotations(study_id, study_id)
            .await?
            .remove(&study_id)
            .unwrap_or_default();
        Ok(optuna_study(
            record.id,
            record.name,
            &record.spec,
            annotations,
        ))
    }

    /// Not found unless the study is an Optuna study (read once per process).
    async fn check_optuna_study(&self, study_id: StudyId) -> ServiceResult<()> {
        let config = self.fixed_config(study_id).await?;
        let params = config.space.all_parameters();
        if params.len() == 1 && params[0].id == MARKER_PARAMETER {
            Ok(())
        } else {
            Err(not_found_study(study_id))
        }
    }

    pub async fn optuna_delete_study(
        &self,
        actor: &Caller,
        study_id: StudyId,
    ) -> ServiceResult<()> {
        self.check_optuna_study(study_id).await?;
        self.delete_study(actor, study_id).await
    }

    /// Set a study's user attribute (`system`: a system attribute) to a JSON value.
    pub async fn optuna_set_study_attr(
        &self,
        actor: &Caller,
        study_id: StudyId,
        system: bool,
        key: &str,
        value: JsonValue,
    ) -> ServiceResult<()> {
        self.check_optuna_study(study_id).await?;
        let key = if system {
            format!("{SYSTEM_PREFIX}{key}")
        } else {
            key.to_string()
        };
        self.annotate_study(actor, study_id, attr_update(key, value))
            .await
    }

    /// A new trial; its id.
    pub async fn optuna_create_trial(
        &self,
        actor: &Caller,
        study_id: StudyId,
        template: Option<OptunaTemplate>,
    ) -> ServiceResult<TrialId> {
        self.check_optuna_study(study_id).await?;
        self.check_reporter(actor, study_id, None).await?;
        let Some(template) = template else {
            let change = OptunaChange::Create {
                state: OptunaState::Running,
                parameters: BTreeMap::new(),
                final_metrics: None,
                intermediate: Vec::new(),
                started_at: None,
                completed_at: None,
            };
            return Ok(self.optuna_change(study_id, change).await?.id);
        };
        let config = self.fixed_config(study_id).await?;
        let ids: Vec<String> = config.metrics.iter().map(|m| m.id.clone()).collect();
        let final_metrics = match &template.values {
            Some(values) => Some(self.metrics_of(&ids, values)?),
            None => None,
        };
        let first = ids.first().cloned().unwrap_or_default();
        let values: Vec<f64> = template.intermediate_values.values().copied().collect();
        check_finite(&values, "template_trial.intermediate_values")?;
        let params: Vec<f64> = template.params.values().copied().collect();
        check_finite(&params, "template_trial.params")?;
        let intermediate = template
            .intermediate_values
            .iter()
            .map(|(step, value)| Measurement {
                step: *step,
                elapsed_secs: None,
                metrics: BTreeMap::from([(first.clone(), *value)]),
            })
            .collect();
        let parameters = template
            .params
            .iter()
            .map(|(name, v)| (name.clone(), Value::Float(*v)))
            .collect();
        // Created running, its attributes written, then put in its state: a worker never
        // takes an enqueued trial before its fixed parameters are there.
        let mut attrs: BTreeMap<String, JsonValue> = template.user_attrs;
        for (key, value) in template.system_attrs {
            attrs.insert(format!("{SYSTEM_PREFIX}{key}"), value);
        }
        for (name, dist) in template.distributions {
            attrs.insert(format!("{DISTRIBUTION_PREFIX}{name}"), dist);
        }
        let direct = attrs.is_empty();
        let create = OptunaChange::Create {
            state: if direct {
                template.state
            } else {
                OptunaState::Running
            },
            parameters,
            final_metrics: if direct { final_metrics.clone() } else { None },
            intermediate,
            started_at: template.started_at,
            completed_at: if direct { template.completed_at } else { None },
        };
        let trial_id = self.optuna_change(study_id, create).await?.id;
        if direct {
            return Ok(trial_id);
        }
        let update = AnnotationUpdate {
            user_attrs: Some(attrs),
            ..AnnotationUpdate::default()
        };
        self.annotate_trial(actor, study_id, trial_id, update)
            .await?;
        if template.state != OptunaState::Running {
            let settle = OptunaChange::SetState {
                trial_id,
                state: template.state,
                final_metrics,
                from_waiting_only: false,
                started_at: template.started_at,
                completed_at: template.completed_at,
            };
            self.submit_optuna(study_id, settle).await?;
        }
        Ok(trial_id)
    }

    fn metrics_of(&self, ids: &[String], values: &[f64]) -> ServiceResult<BTreeMap<String, f64>> {
        if values.len() != ids.len() {
            return Err(ServiceError::invalid(
                "values",
                format!(
                    "the study has {} objectives and {} values were given",
                    ids.len(),
                    values.len()
                ),
            ));
        }
        check_finite(values, "values")?;
        Ok(ids.iter().cloned().zip(values.iter().copied()).collect())
    }

    /// Set a parameter of an unfinished trial, with its distribution (JSON).
    pub async fn optuna_set_param(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        name: &str,
        value: f64,
        distribution: JsonValue,
    ) -> ServiceResult<()> {
        self.check_optuna_study(study_id).await?;
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        check_finite(&[value], "param_value_internal")?;
        let key = format!("{DISTRIBUTION_PREFIX}{name}");
        if let Some(first) = self.store.first_trial_attr(study_id, &key).await?
            && let Err(incompatible) = check_distribution_compatibility(&first, &distribution)
        {
            // As Optuna's storages: a missing or finished trial is that error, not this one.
            let record = self.trial_record(study_id, trial_id).await?;
            if OptunaState::of(record.state, record.early_stopped).is_finished() {
                return Err(ServiceError::conflict(format!(
                    "trial {trial_id} of study {study_id} is already {}",
                    record.state.as_str()
                )));
            }
            return Err(incompatible);
        }
        let change = OptunaChange::SetParameter {
            trial_id,
            name: name.to_string(),
            value,
        };
        self.optuna_change(study_id, change).await?;
        self.annotate_trial(actor, study_id, trial_id, attr_update(key, distribution))
            .await
    }

    /// Optuna's `set_trial_state_values`: false when asked to run a trial that is no longer
    /// waiting (another worker took it).
    pub async fn optuna_set_state(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        state: OptunaState,
        values: Option<Vec<f64>>,
    ) -> ServiceResult<bool> {
        self.check_optuna_study(study_id).await?;
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        let config = self.fixed_config(study_id).await?;
        let ids: Vec<String> = config.metrics.iter().map(|m| m.id.clone()).collect();
        let final_metrics = match values {
            Some(values) if state.is_finished() => Some(self.metrics_of(&ids, &values)?),
            _ => None,
        };
        let change = OptunaChange::SetState {
            trial_id,
            state,
            final_metrics,
            from_waiting_only: state == OptunaState::Running,
            started_at: None,
            completed_at: None,
        };
        self.submit_optuna(study_id, change).await
    }

    pub async fn optuna_set_intermediate(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        step: i64,
        value: f64,
    ) -> ServiceResult<()> {
        self.check_optuna_study(study_id).await?;
        self.check_reporter(actor, study_id, Some(trial_id)).await?;
        check_finite(&[value], "intermediate_value")?;
        if step < 0 {
            return Err(ServiceError::invalid("step", "a step is 0 or more"));
        }
        let config = self.fixed_config(study_id).await?;
        let first = config
            .metrics
            .first()
            .map(|m| m.id.clone())
            .unwrap_or_default();
        let change = OptunaChange::SetIntermediate {
            trial_id,
            measurement: Measurement {
                step,
                elapsed_secs: None,
                metrics: BTreeMap::from([(first, value)]),
            },
        };
        self.optuna_change(study_id, change).await?;
        Ok(())
    }

    /// Set an unfinished trial's user attribute (`system`: a system attribute).
    pub async fn optuna_set_trial_attr(
        &self,
        actor: &Caller,
        study_id: StudyId,
        trial_id: TrialId,
        system: bool,
        key: &str,
        value: JsonValue,
    ) -> ServiceResult<()> {
        self.check_optuna_study(study_id).await?;
        let record = self.trial_record(study_id, trial_id).await?;
        if !record.state.is_unfinished() {
            return Err(ServiceError::conflict(format!(
                "trial {trial_id} of study {study_id} is already {}",
                record.state.as_str()
            )));
        }
        let key = if system {
            format!("{SYSTEM_PREFIX}{key}")
        } else {
            key.to_string()
        };
        self.annotate_trial(actor, study_id, trial_id, attr_update(key, value))
            .await
    }

    pub async fn optuna_trial(
        &self,
        study_id: StudyId,
        trial_id: TrialId,
    ) -> ServiceResult<OptunaTrial> {
        self.check_optuna_study(study_id).await?;
        let trial = self.get_trial(study_id, trial_id).await?;
        Ok(optuna_trial(
            study_id,
            &self.optuna_metric_ids(study_id).await?,
            trial,
        ))
    }

    /// The trials named in `included` and those after `after` (by id), by id: what the
    /// client's cache asks for (its unfinished trials, and any new ones).
    pub async fn optuna_trials(
        &self,
        study_id: StudyId,
        included: &[TrialId],
        after: TrialId,
    ) -> ServiceResult<Vec<OptunaTrial>> {
        self.check_optuna_study(study_id).await?;
        let ids = self.optuna_metric_ids(study_id).await?;
        let after = after.max(TrialId::new(0));
        let mut wanted: Vec<TrialId> = included.iter().copied().filter(|t| *t <= after).collect();
        wanted.sort_unstable();
        wanted.dedup();
        // The unfinished trials a client holds are usually just below its newest: one scan
        // from the oldest reads them with the new ones. A trial left running long ago is
        // read on its own instead (a scan from it would read every trial since).
        let scan_from = match wanted.first() {
            Some(first) if after.get() - first.get() < NEAR_SCAN => TrialId::new(first.get() - 1),
            _ => after,
        };
        let mut trials: BTreeMap<TrialId, OptunaTrial> = BTreeMap::new();
        let mut token: Option<String> = None;
        loop {
            let (limit, cursor) =
                super::paging::page_bounds::<TrialId>(Some(1000), token.as_deref())?;
            let records = self
                .store
                .list_trials(study_id, None, cursor.max(scan_from), limit + 1)
                .await?;
            let (records, next) = super::paging::split_page(records, limit, |t| t.id);
            let records: Vec<_> = records
                .into_iter()
                .filter(|t| t.id > after || wanted.binary_search(&t.id).is_ok())
                .collect();
            for view in self.trial_views(study_id, records).await? {
                trials.insert(view.id, optuna_trial(study_id, &ids, view));
            }
            match next {
                Some(next) => token = Some(next),
                None => break,
            }
        }
        for id in wanted.iter().filter(|t| **t <= scan_from) {
            match self.get_trial(study_id, *id).await {
                Ok(view) => {
                    trials.insert(*id, optuna_trial(study_id, &ids, view));
                }
                Err(ServiceError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        if trials.is_empty() {
            // Nothing new, or no study any more (deleted since this process read its config).
            self.study_record(study_id).await?;
        }
        Ok(trials.into_values().collect())
    }

    async fn optuna_metric_ids(&self, study_id: StudyId) -> ServiceResult<Vec<String>> {
        let config = self.fixed_config(study_id).await?;
        Ok(config.metrics.iter().map(|m| m.id.clone()).collect())
    }

    async fn optuna_change(
        &self,
        study_id: StudyId,
        change: OptunaChange,
    ) -> ServiceResult<crate::store::TrialRecord> {
        self.change_trial_record(study_id, Command::Optuna(change))
            .await
    }

    /// A change whose answer is whether it was made.
    async fn submit_optuna(&self, study_id: StudyId, change: OptunaChange) -> ServiceResult<bool> {
        match self
            .commits
            .submit(study_id, Command::Optuna(change))
            .await?
        {
            Reply::Updated(updated) => Ok(updated),
            Reply::Trial(_) => Ok(true),
            other => Err(unexpected(other)),
        }
    }
}

/// A distribution's kind as Optuna compares them: its class (Optuna's deprecated classes read
/// as the ones that replaced them) and, for numbers, whether it is on a log scale. A class
/// this server does not know (a later Optuna's) is compared by its name alone.
#[derive(Debug, PartialEq, Eq)]
enum DistributionKind {
    Float { log: bool },
    Int { log: bool },
    Categorical,
    Other(String),
}

/// The kind of a distribution in Optuna's JSON form (`{"name": …, "attributes": {…}}`, as
/// `optuna.distributions.distribution_to_json` writes it), and its attributes.
fn distribution_kind(dist: &JsonValue) -> ServiceResult<(DistributionKind, &JsonValue)> {
    let unknown = || {
        ServiceError::invalid(
            "distribution",
            format!("not a distribution of Optuna's: {dist}"),
        )
    };
    let name = dist
        .get("name")
        .and_then(JsonValue::as_str)
        .ok_or_else(unknown)?;
    let attributes = dist.get("attributes").ok_or_else(unknown)?;
    let log = attributes
        .get("log")
        .and_then(JsonValue::as_bool)
        .unwrap_or(false);
    let kind = match name {
        "FloatDistribution" => DistributionKind::Float { log },
        "IntDistribution" => DistributionKind::Int { log },
        "CategoricalDistribution" => DistributionKind::Categorical,
        "UniformDistribution" | "DiscreteUniformDistribution" => {
            DistributionKind::Float { log: false }
        }
        "LogUniformDistribution" => DistributionKind::Float { log: true },
        "IntUniformDistribution" => DistributionKind::Int { log: false },
        "IntLogUniformDistribution" => DistributionKind::Int { log: true },
        other => DistributionKind::Other(other.to_string()),
    };
    Ok((kind, attributes))
}

/// Two choices equal as Python's `==` has them (Optuna compares its choices' tuples): numbers
/// by value (`1 == 1.0`), and `true`/`false` equal to 1 and 0.
fn python_equal(a: &JsonValue, b: &JsonValue) -> bool {
    let number = |v: &JsonValue| match v {
        JsonValue::Bool(b) => Some(f64::from(u8::from(*b))),
        JsonValue::Number(n) => n.as_f64(),
        _ => None,
    };
    match (number(a), number(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Optuna's `check_distribution_compatibility`: a parameter's distribution in a study must be
/// of the class of the first one set (`old`), with the same `log` for numbers and the same
/// choices, in order, for categories; the ranges may differ. Its refusal is Optuna's
/// `ValueError` (`INVALID_ARGUMENT`).
fn check_distribution_compatibility(old: &JsonValue, new: &JsonValue) -> ServiceResult<()> {
    let (old_kind, old_attrs) = distribution_kind(old)?;
    let (new_kind, new_attrs) = distribution_kind(new)?;
    let refuse = |message: &str| Err(ServiceError::invalid("distribution", message));
    match (&old_kind, &new_kind) {
        (DistributionKind::Float { log: a }, DistributionKind::Float { log: b })
        | (DistributionKind::Int { log: a }, DistributionKind::Int { log: b }) => {
            if a != b {
                return refuse(
                    "Cannot set different log configuration to the same parameter name.",
                );
            }
            Ok(())
        }
        (DistributionKind::Categorical, DistributionKind::Categorical) => {
            let choices = |attrs: &JsonValue| {
                attrs
                    .get("choices")
                    .and_then(JsonValue::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            let (a, b) = (choices(old_attrs), choices(new_attrs));
            if a.len() != b.len() || !a.iter().zip(&b).all(|(x, y)| python_equal(x, y)) {
                return refuse("CategoricalDistribution does not support dynamic value space.");
            }
            Ok(())
        }
        (DistributionKind::Other(a), DistributionKind::Other(b)) if a == b => Ok(()),
        _ => refuse("Cannot set different distribution kind to the same parameter name."),
    }
}

fn attr_update(key: String, value: JsonValue) -> AnnotationUpdate {
    AnnotationUpdate {
        user_attrs: Some(BTreeMap::from([(key, value)])),
        ..AnnotationUpdate::default()
    }
}

fn optuna_study(id: StudyId, name: String, spec: &StudySpec, notes: Annotations) -> OptunaStudy {
    let attrs = split_attrs(notes.user_attrs);
    OptunaStudy {
        id,
        name,
        maximize: spec
            .metrics
            .iter()
            .map(|m| m.goal == crate::model::MetricGoal::Maximize)
            .collect(),
        user_attrs: attrs.user,
        system_attrs: attrs.system,
    }
}

/// An Augur trial as Optuna sees it; `metric_ids` are the study's objectives in order. A
/// parameter shows with its distribution only (the two are written one after the other).
fn optuna_trial(study_id: StudyId, metric_ids: &[String], trial: Trial) -> OptunaTrial {
    let state = OptunaState::of(trial.state, trial.early_stopped);
    let mut attrs = split_attrs(trial.annotations.user_attrs);
    let mut params = BTreeMap::new();
    for (name, value) in &trial.parameters {
        if let (true, Some(v)) = (attrs.distributions.contains_key(name), value.as_f64()) {
            params.insert(name.clone(), v);
        }
    }
    attrs
        .distributions
        .retain(|name, _| params.contains_key(name));
    let values = trial.final_measurement.as_ref().and_then(|m| {
        metric_ids
            .iter()
            .map(|id| m.metrics.get(id).copied())
            .collect::<Option<Vec<f64>>>()
    });
    let first = metric_ids.first();
    let intermediate_values = trial
        .measurements
        .iter()
        .filter_map(|m| Some((m.step, *m.metrics.get(first?)?)))
        .collect();
    OptunaTrial {
        study_id,
        id: trial.id,
        state,
        values,
        started_at: trial.started_at,
        completed_at: trial.completed_at,
        params,
        distributions: attrs.distributions,
        user_attrs: attrs.user,
        system_attrs: attrs.system,
        intermediate_values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_optuna_state_reads_back_as_itself_from_augurs() {
        for state in [
            OptunaState::Running,
            OptunaState::Complete,
            OptunaState::Pruned,
            OptunaState::Fail,
            OptunaState::Waiting,
        ] {
            let (augur, early_stopped) = state.to_augur();
            assert_eq!(OptunaState::of(augur, early_stopped), state);
        }
    }

    #[test]
    fn an_optuna_spec_is_valid_and_recognised_as_optunas() {
        let spec = optuna_spec("s", &[true, false]).expect("a spec");
        spec.validate().expect("valid");
        assert!(is_optuna_spec(&spec));
        let ids: Vec<&str> = spec.metrics.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["value_0", "value_1"]);
        assert!(optuna_spec("s", &[]).is_err());
    }

    fn float(low: f64, high: f64, log: bool) -> JsonValue {
        json!({"name": "FloatDistribution",
               "attributes": {"low": low, "high": high, "log": log, "step": null}})
    }

    fn int(low: i64, high: i64, log: bool) -> JsonValue {
        json!({"name": "IntDistribution",
               "attributes": {"low": low, "high": high, "log": log, "step": 1}})
    }

    fn categorical(choices: JsonValue) -> JsonValue {
        json!({"name": "CategoricalDistribution", "attributes": {"choices": choices}})
    }

    #[test]
    fn distributions_are_compatible_as_optunas_check_says() {
        let ok = |a: &JsonValue, b: &JsonValue| check_distribution_compatibility(a, b).is_ok();
        // Ranges may change; the class, log scale and choices may not.
        assert!(ok(&float(0.0, 1.0, false), &float(-5.0, 5.0, false)));
        assert!(ok(&int(1, 8, true), &int(2, 100, true)));
        assert!(ok(
            &categorical(json!(["a", null, 3.5])),
            &categorical(json!(["a", null, 3.5]))
        ));
        assert!(!ok(&float(0.0, 1.0, false), &int(0, 1, false)));
        assert!(!ok(&int(0, 1, false), &categorical(json!([0, 1]))));
        assert!(!ok(&categorical(json!([0, 1])), &float(0.0, 1.0, false)));
        assert!(!ok(&float(1e-5, 1.0, false), &float(1e-5, 1.0, true)));
        assert!(!ok(&int(1, 8, true), &int(1, 8, false)));
        assert!(!ok(
            &categorical(json!(["a", "b"])),
            &categorical(json!(["a", "c"]))
        ));
        assert!(!ok(
            &categorical(json!(["a", "b"])),
            &categorical(json!(["b", "a"]))
        ));
        assert!(!ok(
            &categorical(json!(["a"])),
            &categorical(json!(["a", "b"]))
        ));
        // Python's equality: 1 == 1.0 == True.
        assert!(ok(
            &categorical(json!([1, false])),
            &categorical(json!([1.0, 0]))
        ));
        // Optuna's deprecated classes are the ones that replaced them.
        let log_uniform = json!({"name": "LogUniformDistribution",
                                 "attributes": {"low": 0.1, "high": 1.0}});
        assert!(ok(&log_uniform, &float(0.5, 2.0, true)));
        assert!(!ok(&log_uniform, &float(0.5, 2.0, false)));
        let int_uniform = json!({"name": "IntUniformDistribution",
                                 "attributes": {"low": 0, "high": 3, "step": 1}});
        assert!(ok(&int_uniform, &int(0, 9, false)));
        // A class of a later Optuna: by its name.
        let later = json!({"name": "LaterDistribution", "attributes": {}});
        assert!(ok(&later, &later));
        assert!(!ok(&later, &float(0.0, 1.0, false)));
    }

    #[test]
    fn an_incompatible_distribution_is_an_invalid_argument_naming_optunas_reason() {
        let refused = check_distribution_compatibility(&float(0.0, 1.0, false), &int(0, 1, false));
        let Err(ServiceError::Invalid(error)) = refused else {
            panic!("expected Invalid, got {refused:?}");
        };
        assert_eq!(error.field, "distribution");
        assert!(
            error.message.contains("different distribution kind"),
            "{error:?}"
        );
        let garbled = check_distribution_compatibility(&json!({"x": 1}), &float(0.0, 1.0, false));
        assert!(matches!(garbled, Err(ServiceError::Invalid(_))));
    }

    #[test]
    fn attributes_split_by_their_prefixes() {
        let split = split_attrs(BTreeMap::from([
            ("mine".to_string(), json!(1)),
            (format!("{SYSTEM_PREFIX}sys"), json!(2)),
            (format!("{DISTRIBUTION_PREFIX}x"), json!({"name": "F"})),
        ]));
        assert_eq!(split.user, BTreeMap::from([("mine".to_string(), json!(1))]));
        assert_eq!(
            split.system,
            BTreeMap::from([("sys".to_string(), json!(2))])
        );
        assert_eq!(split.distributions.len(), 1);
    }
}
