//! Vertex AI `HyperparameterTuningJob` specs, unchanged: the REST JSON (camelCase) and the
//! YAML that `gcloud ai hp-tuning-jobs create --config` takes (either case), read into an
//! Augur [`StudySpec`] and written back from one. The mapping is the table in the README.
//! Fields Augur cannot honour give a warning, or, where ignoring them would change the
//! results, an error naming the field in Vertex's own terms (`studySpec.parameters[2]…`).

use std::collections::BTreeMap;

use augur_optimizer::Value;
use serde_json::{Map, Value as Json, json};

use super::ValidationError;
use super::executor::ExecutorSpec;
use super::job::{
    Resources, TrialJobSpec, WorkerPoolSpec, check_accelerator_type, check_machine_type,
};
use super::spec::{
    AlgorithmName, ChildInput, EarlyStoppingSpec, MeasurementSelection, MetricGoal,
    MetricSpecInput, ParameterInput, ParameterType, ScaleName, StoppingRuleName, StudySpec,
};
use super::study_stopping::StudyStoppingSpec;

/// A Vertex spec read into Augur's, with what was not carried over.
#[derive(Debug, Clone, PartialEq)]
pub struct VertexImport {
    pub spec: StudySpec,
    /// One sentence per field Augur ignores (it changes no result).
    pub warnings: Vec<String>,
}

/// Whether a document is a Vertex `HyperparameterTuningJob` (it has a `studySpec`) rather
/// than an Augur spec (which never has one: unknown fields are refused).
pub fn is_vertex_job(doc: &Json) -> bool {
    doc.get("studySpec")
        .or_else(|| doc.get("study_spec"))
        .is_some()
}

/// A JSON object read by Vertex's camelCase names, accepting their snake_case forms too.
#[derive(Clone, Copy)]
struct Obj<'a> {
    map: &'a Map<String, Json>,
    path: &'a str,
}

fn snake(camel: &str) -> String {
    let mut out = String::new();
    for c in camel.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn camel(snake_name: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in snake_name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

impl<'a> Obj<'a> {
    fn new(doc: &'a Json, path: &'a str) -> Result<Obj<'a>, ValidationError> {
        let map = doc
            .as_object()
            .ok_or_else(|| ValidationError::new(path, "must be an object"))?;
        Ok(Obj { map, path })
    }

    fn get(&self, key: &str) -> Option<&'a Json> {
        self.map.get(key).or_else(|| self.map.get(&snake(key)))
    }

    fn field(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn err(&self, key: &str, message: impl Into<String>) -> ValidationError {
        ValidationError::new(self.field(key), message)
    }

    fn string(&self, key: &str) -> Result<Option<String>, ValidationError> {
        match self.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(key, "must be a string")),
        }
    }

    fn required_string(&self, key: &str) -> Result<String, ValidationError> {
        self.string(key)?
            .ok_or_else(|| self.err(key, "is required"))
    }

    /// An int64, which Vertex's JSON writes as a string (`"5"`) and YAML as a number.
    fn int(&self, key: &str) -> Result<Option<i64>, ValidationError> {
        match self.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => json_int(v)
                .map(Some)
                .ok_or_else(|| self.err(key, "must be a whole number")),
        }
    }

    fn number(&self, key: &str) -> Result<Option<f64>, ValidationError> {
        match self.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(v) => json_number(v)
                .map(Some)
                .ok_or_else(|| self.err(key, "must be a number")),
        }
    }

    fn list(&self, key: &str) -> Result<&'a [Json], ValidationError> {
        match self.get(key) {
            None | Some(Json::Null) => Ok(&[]),
            Some(Json::Array(items)) => Ok(items),
            Some(_) => Err(self.err(key, "must be a list")),
        }
    }

    /// The keys present, in camelCase.
    fn keys(&self) -> impl Iterator<Item = String> + 'a {
        self.map.keys().map(|k| camel(k))
    }
}

fn json_int(v: &Json) -> Option<i64> {
    match v {
        Json::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Json::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn json_number(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// One warning per key of `obj` outside `known`: a Vertex field Augur has no use for.
fn warn_unknown(obj: &Obj<'_>, known: &[&str], warnings: &mut Vec<String>) {
    for key in obj.keys() {
        if !known.contains(&key.as_str()) {
            warnings.push(format!(
                "{}: not a field Augur uses; ignored",
                obj.field(&key)
            ));
        }
    }
}

/// Output-only fields of a job as the REST API returns it: read back unchanged, ignored.
const OUTPUT_ONLY: [&str; 9] = [
    "name",
    "state",
    "createTime",
    "startTime",
    "endTime",
    "updateTime",
    "trials",
    "error",
    "satisfiesPzs",
];

/// Read a Vertex `HyperparameterTuningJob` (JSON or YAML, parsed) into an Augur spec.
pub fn from_vertex(doc: &Json) -> Result<VertexImport, ValidationError> {
    let job = Obj::new(doc, "")?;
    let mut warnings = Vec::new();
    for key in job.keys() {
        let known = [
            "displayName",
            "maxTrialCount",
            "parallelTrialCount",
            "maxFailedTrialCount",
            "studySpec",
            "trialJobSpec",
        ];
        if known.contains(&key.as_str()) || OUTPUT_ONLY.contains(&key.as_str()) {
            continue;
        }
        warnings.push(match key.as_str() {
            "encryptionSpec" => {
                "encryptionSpec: Augur keeps no customer-managed keys; ignored".into()
            }
            "labels" => "labels: ignored (Augur studies have no labels)".into(),
            other => format!("{other}: not a field Augur uses; ignored"),
        });
    }
    let study_doc = job
        .get("studySpec")
        .ok_or_else(|| job.err("studySpec", "is required"))?;
    let study = Obj::new(study_doc, "studySpec")?;
    let max_trials = job
        .int("maxTrialCount")?
        .ok_or_else(|| job.err("maxTrialCount", "is required"))?;
    let parallel = job.int("parallelTrialCount")?.unwrap_or(1);
    let max_failed = job.int("maxFailedTrialCount")?.filter(|n| *n > 0);
    let mut spec = StudySpec {
        name: job.required_string("displayName")?,
        algorithm: algorithm(&study)?,
        metrics: metrics(&study, &mut warnings)?,
        parameters: parameters(
            study.list("parameters")?,
            "studySpec.parameters",
            &mut warnings,
        )?,
        max_trials,
        parallel_trials: parallel,
        max_failed_trials: max_failed,
        fail_fast_trials: super::spec::DEFAULT_FAIL_FAST_TRIALS,
        measurement_selection: measurement_selection(&study)?,
        seed: None,
        early_stopping: early_stopping(&study, &mut warnings)?,
        study_stopping: study_stopping(&study, &mut warnings)?,
        trial_lease_secs: super::spec::DEFAULT_TRIAL_LEASE_SECS,
        suggestion_time_budget_secs: super::spec::DEFAULT_SUGGESTION_TIME_BUDGET_SECS,
        trial_job: None,
        prior_studies: Vec::new(),
        fidelity: None,
        scheduler: None,
        pbt: None,
        max_budget: None,
        notifications: Vec::new(),
    };
    for key in study.keys() {
        let known = [
            "metrics",
            "parameters",
            "algorithm",
            "measurementSelectionType",
            "decayCurveStoppingSpec",
            "medianAutomatedStoppingSpec",
            "convexAutomatedStoppingSpec",
            "studyStoppingConfig",
        ];
        if known.contains(&key.as_str()) {
            continue;
        }
        warnings.push(match key.as_str() {
            "observationNoise" => {
                "studySpec.observationNoise: the GP learns the noise itself; ignored".into()
            }
            other => format!("studySpec.{other}: not a field Augur uses; ignored"),
        });
    }
    if let Some(trial_job) = job.get("trialJobSpec") {
        spec.trial_job = Some(trial_job_spec(
            &Obj::new(trial_job, "trialJobSpec")?,
            &mut warnings,
        )?);
    }
    // Whatever Vertex accepts and Augur does not is named here, in Augur's terms.
    spec.clone().with_seed(0).validate().map_err(vertex_field)?;
    Ok(VertexImport { spec, warnings })
}

/// An error of Augur's validation, renamed to the Vertex field it came from where the names
/// differ (`study_stopping.min_num_trials` → `studySpec.studyStoppingConfig.minNumTrials`).
fn vertex_field(mut e: ValidationError) -> ValidationError {
    if let Some(rest) = e.field.strip_prefix("study_stopping.") {
        let name = rest.strip_suffix("_secs").unwrap_or(rest);
        e.field = format!("studySpec.studyStoppingConfig.{}", camel(name));
    }
    e
}

fn algorithm(study: &Obj<'_>) -> Result<AlgorithmName, ValidationError> {
    match study.string("algorithm")?.as_deref() {
        None | Some("ALGORITHM_UNSPECIFIED") => Ok(AlgorithmName::GpBandit),
        Some("GRID_SEARCH") => Ok(AlgorithmName::Grid),
        Some("RANDOM_SEARCH") => Ok(AlgorithmName::Random),
        Some(other) => Err(study.err(
            "algorithm",
            format!("{other:?}: use ALGORITHM_UNSPECIFIED, GRID_SEARCH or RANDOM_SEARCH"),
        )),
    }
}

fn measurement_selection(study: &Obj<'_>) -> Result<MeasurementSelection, ValidationError> {
    match study.string("measurementSelectionType")?.as_deref() {
        None | Some("MEASUREMENT_SELECTION_TYPE_UNSPECIFIED") | Some("LAST_MEASUREMENT") => {
            Ok(MeasurementSelection::Last)
        }
        Some("BEST_MEASUREMENT") => Ok(MeasurementSelection::Best),
        Some(other) => Err(study.err(
            "measurementSelectionType",
            format!("{other:?}: use LAST_MEASUREMENT or BEST_MEASUREMENT"),
        )),
    }
}

fn metrics(
    study: &Obj<'_>,
    warnings: &mut Vec<String>,
) -> Result<Vec<MetricSpecInput>, ValidationError> {
    let mut out = Vec::new();
    for (i, m) in study.list("metrics")?.iter().enumerate() {
        let path = format!("studySpec.metrics[{i}]");
        let m = Obj::new(m, &path)?;
        warn_unknown(&m, &["metricId", "goal", "safetyConfig"], warnings);
        let (mut safety_threshold, mut desired_min_safe_trials_fraction) = (None, None);
        if let Some(safety) = m.get("safetyConfig") {
            let safety_path = m.field("safetyConfig");
            let safety = Obj::new(safety, &safety_path)?;
            warn_unknown(
                &safety,
                &["safetyThreshold", "desiredMinSafeTrialsFraction"],
                warnings,
            );
            safety_threshold = Some(
                safety
                    .number("safetyThreshold")?
                    .ok_or_else(|| safety.err("safetyThreshold", "is required"))?,
            );
            desired_min_safe_trials_fraction = safety.number("desiredMinSafeTrialsFraction")?;
        }
        let goal = match m.required_string("goal")?.as_str() {
            "MAXIMIZE" => MetricGoal::Maximize,
            "MINIMIZE" => MetricGoal::Minimize,
            other => return Err(m.err("goal", format!("{other:?}: use MAXIMIZE or MINIMIZE"))),
        };
        out.push(MetricSpecInput {
            id: m.required_string("metricId")?,
            goal,
            safety_threshold,
            desired_min_safe_trials_fraction,
        });
    }
    Ok(out)
}

fn early_stopping(
    study: &Obj<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<EarlyStoppingSpec>, ValidationError> {
    if study.get("convexAutomatedStoppingSpec").is_some() {
        return Err(study.err(
            "convexAutomatedStoppingSpec",
            "not supported: Vertex's convex rule records measurements it predicts on the \
             trials it stops, and Augur keeps only reported ones (see the README); use \
             medianAutomatedStoppingSpec or decayCurveStoppingSpec",
        ));
    }
    let rules = [
        ("decayCurveStoppingSpec", StoppingRuleName::DecayCurve),
        ("medianAutomatedStoppingSpec", StoppingRuleName::Median),
    ];
    for (key, rule) in rules {
        let Some(doc) = study.get(key) else { continue };
        let path = format!("studySpec.{key}");
        let stopping = Obj::new(doc, &path)?;
        warn_unknown(&stopping, &["useElapsedDuration"], warnings);
        if stopping.get("useElapsedDuration").and_then(Json::as_bool) == Some(true) {
            warnings.push(format!(
                "{path}.useElapsedDuration: Augur compares curves by step; ignored"
            ));
        }
        return Ok(Some(EarlyStoppingSpec {
            rule,
            min_completed_trials: None,
            min_curve_points: None,
            sigmas: None,
            metric: None,
        }));
    }
    Ok(None)
}

/// `studyStoppingConfig` as `study_stopping`. The runtime constraints are refused: Augur's
/// rules have no wall-clock bounds of a whole study, and ignoring one would run a study
/// longer or shorter than asked.
fn study_stopping(
    study: &Obj<'_>,
    warnings: &mut Vec<String>,
) -> Result<Option<StudyStoppingSpec>, ValidationError> {
    let Some(doc) = study.get("studyStoppingConfig") else {
        return Ok(None);
    };
    let config = Obj::new(doc, "studySpec.studyStoppingConfig")?;
    for key in ["minimumRuntimeConstraint", "maximumRuntimeConstraint"] {
        if config.get(key).is_some_and(|v| !v.is_null()) {
            return Err(config.err(
                key,
                "not supported: Augur bounds a study by trials and by time without progress \
                 (maxNumTrials, maxDurationNoProgress), not by a runtime",
            ));
        }
    }
    warn_unknown(
        &config,
        &[
            "shouldStopAsap",
            "minNumTrials",
            "maxNumTrials",
            "maxNumTrialsNoProgress",
            "maxDurationNoProgress",
            "minimumRuntimeConstraint",
            "maximumRuntimeConstraint",
        ],
        warnings,
    );
    let should_stop_asap = match config.get("shouldStopAsap") {
        None | Some(Json::Null) => false,
        Some(Json::Bool(b)) => *b,
        Some(_) => return Err(config.err("shouldStopAsap", "must be true or false")),
    };
    let max_duration_no_progress_secs = match config.string("maxDurationNoProgress")? {
        None => None,
        Some(text) => Some(parse_duration(&text).ok_or_else(|| {
            config.err(
                "maxDurationNoProgress",
                "must be a duration of at least one second, as \"3600s\"",
            )
        })? as i64),
    };
    Ok(Some(StudyStoppingSpec {
        min_num_trials: config.int("minNumTrials")?,
        max_num_trials: config.int("maxNumTrials")?,
        max_num_trials_no_progress: config.int("maxNumTrialsNoProgress")?,
        max_duration_no_progress_secs,
        min_delta_change: None,
        should_stop_asap,
    }))
}

fn parameters(
    list: &[Json],
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<ParameterInput>, ValidationError> {
    list.iter()
        .enumerate()
        .map(|(i, p)| parameter(p, &format!("{path}[{i}]"), warnings))
        .collect()
}

fn parameter(
    doc: &Json,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<ParameterInput, ValidationError> {
    let p = Obj::new(doc, path)?;
    warn_unknown(
        &p,
        &[
            "parameterId",
            "scaleType",
            "doubleValueSpec",
            "integerValueSpec",
            "categoricalValueSpec",
            "discreteValueSpec",
            "conditionalParameterSpecs",
        ],
        warnings,
    );
    let id = p.required_string("parameterId")?;
    let scale = scale_type(&p)?;
    let (kind, value_doc, value_path) = value_spec(&p, path, warnings)?;
    let value_spec = Obj::new(value_doc, &value_path)?;
    let mut out = ParameterInput {
        id,
        kind: ParameterType::Double,
        min: None,
        max: None,
        values: None,
        scale,
        children: Vec::new(),
    };
    match kind {
        "doubleValueSpec" => {
            out.min = value_spec.number("minValue")?;
            out.max = value_spec.number("maxValue")?;
        }
        "integerValueSpec" => {
            out.kind = ParameterType::Integer;
            out.min = value_spec.int("minValue")?.map(|v| v as f64);
            out.max = value_spec.int("maxValue")?.map(|v| v as f64);
        }
        "categoricalValueSpec" => {
            out.kind = ParameterType::Categorical;
            let values = value_spec.list("values")?;
            let strings = values
                .iter()
                .enumerate()
                .map(|(j, v)| match v {
                    Json::String(s) => Ok(Value::Str(s.clone())),
                    _ => Err(value_spec.err(&format!("values[{j}]"), "must be a string")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            out.values = Some(strings);
        }
        _ => {
            out.kind = ParameterType::Discrete;
            let values = value_spec.list("values")?;
            let numbers = values
                .iter()
                .enumerate()
                .map(|(j, v)| {
                    json_number(v)
                        .map(Value::from_number)
                        .ok_or_else(|| value_spec.err(&format!("values[{j}]"), "must be a number"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            out.values = Some(numbers);
        }
    }
    for (c, cond) in p.list("conditionalParameterSpecs")?.iter().enumerate() {
        let cpath = format!("{path}.conditionalParameterSpecs[{c}]");
        out.children.push(conditional(cond, &cpath, warnings)?);
    }
    Ok(out)
}

/// A parameter's `scaleType` (absent or unspecified: the parameter's default).
fn scale_type(p: &Obj<'_>) -> Result<Option<ScaleName>, ValidationError> {
    Ok(match p.string("scaleType")?.as_deref() {
        None | Some("SCALE_TYPE_UNSPECIFIED") => None,
        Some("UNIT_LINEAR_SCALE") => Some(ScaleName::Linear),
        Some("UNIT_LOG_SCALE") => Some(ScaleName::Log),
        Some("UNIT_REVERSE_LOG_SCALE") => Some(ScaleName::ReverseLog),
        Some(other) => {
            return Err(p.err(
                "scaleType",
                format!(
                    "{other:?}: use UNIT_LINEAR_SCALE, UNIT_LOG_SCALE or UNIT_REVERSE_LOG_SCALE"
                ),
            ));
        }
    })
}

/// Which of the four value specs a parameter gives (exactly one), that spec and its path;
/// what Augur ignores in it is warned of.
fn value_spec<'a>(
    p: &Obj<'a>,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<(&'static str, &'a Json, String), ValidationError> {
    let kinds = [
        "doubleValueSpec",
        "integerValueSpec",
        "categoricalValueSpec",
        "discreteValueSpec",
    ];
    let given: Vec<&str> = kinds
        .iter()
        .copied()
        .filter(|k| p.get(k).is_some())
        .collect();
    let [kind] = given.as_slice() else {
        return Err(p.err(
            "doubleValueSpec",
            "give exactly one of doubleValueSpec, integerValueSpec, categoricalValueSpec, discreteValueSpec",
        ));
    };
    let value_path = format!("{path}.{kind}");
    let value_doc = p.get(kind).unwrap_or(&Json::Null);
    let value_spec = Obj::new(value_doc, &value_path)?;
    let value_keys: &[&str] = match *kind {
        "doubleValueSpec" | "integerValueSpec" => &["minValue", "maxValue", "defaultValue"],
        _ => &["values", "defaultValue"],
    };
    warn_unknown(&value_spec, value_keys, warnings);
    if value_spec.get("defaultValue").is_some() {
        warnings.push(format!(
            "{value_path}.defaultValue: Augur's first trials come from its design; ignored"
        ));
    }
    Ok((kind, value_doc, value_path))
}

/// One conditional parameter: the parent values it applies to, and its spec.
fn conditional(
    doc: &Json,
    path: &str,
    warnings: &mut Vec<String>,
) -> Result<ChildInput, ValidationError> {
    let c = Obj::new(doc, path)?;
    warn_unknown(
        &c,
        &[
            "parentDiscreteValues",
            "parentIntValues",
            "parentCategoricalValues",
            "parameterSpec",
        ],
        warnings,
    );
    let parents = [
        "parentDiscreteValues",
        "parentIntValues",
        "parentCategoricalValues",
    ];
    let given: Vec<&str> = parents
        .iter()
        .copied()
        .filter(|k| c.get(k).is_some())
        .collect();
    let [which] = given.as_slice() else {
        return Err(c.err(
            "parentCategoricalValues",
            "give exactly one of parentDiscreteValues, parentIntValues, parentCategoricalValues",
        ));
    };
    let values_path = format!("{path}.{which}");
    let values = Obj::new(c.get(which).unwrap_or(&Json::Null), &values_path)?;
    warn_unknown(&values, &["values"], warnings);
    let when = values
        .list("values")?
        .iter()
        .enumerate()
        .map(|(j, v)| {
            let bad = || values.err(&format!("values[{j}]"), "does not match the parent's type");
            match *which {
                "parentCategoricalValues" => v
                    .as_str()
                    .map(|s| Value::Str(s.to_string()))
                    .ok_or_else(bad),
                "parentIntValues" => json_int(v).map(Value::Int).ok_or_else(bad),
                _ => json_number(v).map(Value::from_number).ok_or_else(bad),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let child = c
        .get("parameterSpec")
        .ok_or_else(|| c.err("parameterSpec", "is required"))?;
    let parameter = parameter(child, &format!("{path}.parameterSpec"), warnings)?;
    Ok(ChildInput {
        when,
        parameters: vec![parameter],
    })
}

/// `trialJobSpec` (a `CustomJobSpec`): its worker pools become the trial's cluster, run from
/// their images by the container executor.
fn trial_job_spec(
    spec: &Obj<'_>,
    warnings: &mut Vec<String>,
) -> Result<TrialJobSpec, ValidationError> {
    let mut job = TrialJobSpec {
        executor: ExecutorSpec::Container { image: None },
        ..Default::default()
    };
    let pools = spec.list("workerPoolSpecs")?;
    if pools.is_empty() {
        return Err(spec.err("workerPoolSpecs", "at least the primary's pool is required"));
    }
    for (p, pool) in pools.iter().enumerate() {
        let path = format!("trialJobSpec.workerPoolSpecs[{p}]");
        let pool = Obj::new(pool, &path)?;
        // Vertex marks a skipped pool with an empty spec.
        if pool.map.is_empty() {
            job.worker_pools.push(None);
            continue;
        }
        job.worker_pools.push(Some(worker_pool(&pool, warnings)?));
    }
    // The primary's image, command and args stand for every pool that has the same; a pool
    // that differs keeps its own, even empty (its image's entrypoint or default arguments).
    if let Some(Some(primary)) = job.worker_pools.first().cloned() {
        job.executor = ExecutorSpec::Container {
            image: primary.image.clone(),
        };
        job.command = primary.command.clone().unwrap_or_default();
        job.args = primary.args.clone().unwrap_or_default();
        for pool in job.worker_pools.iter_mut().flatten() {
            if pool.image == primary.image {
                pool.image = None;
            }
            if pool.command.as_ref() == Some(&job.command) {
                pool.command = None;
            }
            if pool.args.as_ref() == Some(&job.args) {
                pool.args = None;
            }
        }
    }
    if let Some(scheduling) = spec.get("scheduling") {
        let scheduling = Obj::new(scheduling, "trialJobSpec.scheduling")?;
        if let Some(timeout) = scheduling.string("timeout")? {
            job.timeout_secs = Some(parse_duration(&timeout).ok_or_else(|| {
                scheduling.err(
                    "timeout",
                    "must be a duration in seconds, such as \"3600s\"",
                )
            })?);
        }
        if scheduling.get("restartJobOnWorkerRestart").is_some() {
            warnings.push(
                "trialJobSpec.scheduling.restartJobOnWorkerRestart: Augur retries the whole cluster (trial_job.max_retries); ignored".into(),
            );
        }
        warn_unknown(
            &scheduling,
            &["timeout", "restartJobOnWorkerRestart"],
            warnings,
        );
    }
    if let Some(base) = spec.get("baseOutputDirectory") {
        let base = Obj::new(base, "trialJobSpec.baseOutputDirectory")?;
        warn_unknown(&base, &["outputUriPrefix"], warnings);
        let uri = base.required_string("outputUriPrefix")?;
        match uri.split_once("://") {
            Some(("file", path)) => job.output_dir = Some(path.to_string()),
            Some((scheme, _)) => warnings.push(format!(
                "trialJobSpec.baseOutputDirectory.outputUriPrefix: {scheme}:// is not mounted by the container executor; trials use the server's output directory (the kubernetes executor passes object-store URIs through)"
            )),
            None => job.output_dir = Some(uri),
        }
    }
    for key in spec.keys() {
        let known = ["workerPoolSpecs", "scheduling", "baseOutputDirectory"];
        if !known.contains(&key.as_str()) {
            warnings.push(match key.as_str() {
                "network" => "trialJobSpec.network: replicas use the host's network; ignored".into(),
                "serviceAccount" => "trialJobSpec.serviceAccount: set trial_job.kubernetes.service_account with the kubernetes executor; ignored".into(),
                other => format!("trialJobSpec.{other}: not a field Augur uses; ignored"),
            });
        }
    }
    Ok(job)
}

fn worker_pool(
    pool: &Obj<'_>,
    warnings: &mut Vec<String>,
) -> Result<WorkerPoolSpec, ValidationError> {
    if pool.get("pythonPackageSpec").is_some() {
        return Err(pool.err(
            "pythonPackageSpec",
            "Vertex's prebuilt training containers are not available: give a containerSpec",
        ));
    }
    let container_doc = pool
        .get("containerSpec")
        .ok_or_else(|| pool.err("containerSpec", "is required"))?;
    let container_path = pool.field("containerSpec");
    let container = Obj::new(container_doc, &container_path)?;
    warn_unknown(
        &container,
        &["imageUri", "command", "args", "env"],
        warnings,
    );
    let strings = |key: &str| -> Result<Vec<String>, ValidationError> {
        container
            .list(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| container.err(&format!("{key}[{i}]"), "must be a string"))
            })
            .collect()
    };
    // Kept apart, as Vertex has them: a replica runs the command, then the args (then the
    // trial's values), which is what the image would run with both overridden.
    let command = strings("command")?;
    let args = strings("args")?;
    let mut env = BTreeMap::new();
    for (i, e) in container.list("env")?.iter().enumerate() {
        let var_path = container.field(&format!("env[{i}]"));
        let var = Obj::new(e, &var_path)?;
        warn_unknown(&var, &["name", "value"], warnings);
        env.insert(
            var.required_string("name")?,
            var.string("value")?.unwrap_or_default(),
        );
    }
    let replicas = pool.int("replicaCount")?.unwrap_or(1);
    let replicas = u32::try_from(replicas)
        .map_err(|_| pool.err("replicaCount", "must be between 1 and 256"))?;
    let MachineSpec {
        resources,
        machine_type,
        accelerator_type,
    } = match pool.get("machineSpec") {
        Some(machine) => read_machine_spec(machine, &pool.field("machineSpec"), warnings)?,
        None => MachineSpec::default(),
    };
    for key in ["diskSpec", "nfsMounts"] {
        if pool.get(key).is_some() {
            warnings.push(format!("{}: ignored", pool.field(key)));
        }
    }
    warn_unknown(
        pool,
        &[
            "machineSpec",
            "replicaCount",
            "containerSpec",
            "diskSpec",
            "nfsMounts",
        ],
        warnings,
    );
    Ok(WorkerPoolSpec {
        replicas,
        command: Some(command),
        args: Some(args),
        env,
        resources,
        image: Some(container.required_string("imageUri")?),
        machine_type,
        accelerator_type,
    })
}

/// A worker pool's `machineSpec`: what its replicas get, and the names kept for export.
#[derive(Default)]
struct MachineSpec {
    resources: Option<Resources>,
    machine_type: Option<String>,
    accelerator_type: Option<String>,
}

fn read_machine_spec(
    doc: &Json,
    machine_path: &str,
    warnings: &mut Vec<String>,
) -> Result<MachineSpec, ValidationError> {
    let machine = Obj::new(doc, machine_path)?;
    warn_unknown(
        &machine,
        &["machineType", "acceleratorType", "acceleratorCount"],
        warnings,
    );
    let mut r = Resources::default();
    let machine_type = machine.string("machineType")?;
    if let Some(kind) = &machine_type {
        check_machine_type(kind, &machine.field("machineType"))?;
        match machine_resources(kind) {
            Some((cpu, gib)) => {
                r.cpu = Some(cpu);
                r.memory = Some(format!("{gib}Gi"));
            }
            None => warnings.push(format!(
                "{machine_path}.machineType: {kind:?} has no known CPU and memory: replicas get no limits (kept for export)"
            )),
        }
    }
    if let Some(count) = machine.int("acceleratorCount")?.filter(|n| *n > 0) {
        r.gpu =
            Some(u32::try_from(count).map_err(|_| machine.err("acceleratorCount", "too large"))?);
    }
    let accelerator_type = machine.string("acceleratorType")?;
    if let Some(kind) = &accelerator_type {
        check_accelerator_type(kind, &machine.field("acceleratorType"))?;
        warnings.push(format!(
            "{machine_path}.acceleratorType: {kind}: replicas get whole GPUs of the machine's kind (kept for export)"
        ));
    }
    Ok(MachineSpec {
        resources: Some(r).filter(|r| *r != Resources::default()),
        machine_type,
        accelerator_type,
    })
}

/// CPUs and memory (GiB) of Compute Engine machine types: `n1-standard-8`, `e2-highmem-4`, …
fn machine_resources(kind: &str) -> Option<(f64, u64)> {
    let mut parts = kind.rsplitn(2, '-');
    let cpus: u64 = parts.next()?.parse().ok()?;
    let family = parts.next()?;
    // GiB per vCPU of each family (Compute Engine's published shapes).
    let per_cpu = match family {
        "n1-standard" => 3.75,
        "n1-highmem" => 6.5,
        "n1-highcpu" => 0.9,
        "n2-standard" | "n2d-standard" | "e2-standard" | "c2-standard" => 4.0,
        "n2-highmem" | "n2d-highmem" | "e2-highmem" => 8.0,
        "n2-highcpu" | "n2d-highcpu" | "e2-highcpu" => 1.0,
        _ => return None,
    };
    Some((cpus as f64, (cpus as f64 * per_cpu).floor().max(1.0) as u64))
}

/// `"3600s"`, `"1.5s"` (protobuf's Duration in JSON) → whole seconds.
fn parse_duration(text: &str) -> Option<u64> {
    let secs: f64 = text.trim().strip_suffix('s')?.parse().ok()?;
    (secs.is_finite() && secs >= 1.0).then(|| secs.round() as u64)
}

/// An Augur spec as a Vertex `HyperparameterTuningJob` (REST JSON, camelCase). Augur's own
/// settings with no Vertex field (seed, leases, time budgets) are left out; a job imported
/// from Vertex comes back as it was, less the fields the import warned it ignores.
///
/// int64 fields (`maxTrialCount`, an integer parameter's `minValue`, `parentIntValues`,
/// `replicaCount`) are written as JSON numbers. Proto3's JSON mapping prints int64 as a
/// string, but its parsers (Vertex's REST API, `gcloud … --config`) take numbers as well, and
/// job files are written with numbers: Vertex's YAML examples, and ours. So a file comes back
/// as its author wrote it (`12`, not `"12"`), and a number reads as one. Augur holds these
/// values as 64-bit floats or small counts, well inside 2^53, so no reader loses a digit.
pub fn to_vertex(spec: &StudySpec) -> Json {
    let mut study = json!({
        "metrics": spec.metrics.iter().map(|m| {
            let mut metric = json!({
                "metricId": m.id,
                "goal": match m.goal { MetricGoal::Maximize => "MAXIMIZE", MetricGoal::Minimize => "MINIMIZE" },
            });
            if let Some(threshold) = m.safety_threshold {
                metric["safetyConfig"] = json!({"safetyThreshold": threshold});
                if let Some(f) = m.desired_min_safe_trials_fraction {
                    metric["safetyConfig"]["desiredMinSafeTrialsFraction"] = json!(f);
                }
            }
            metric
        }).collect::<Vec<_>>(),
        "parameters": spec.parameters.iter().map(vertex_parameter).collect::<Vec<_>>(),
        "algorithm": match spec.algorithm {
            AlgorithmName::GpBandit | AlgorithmName::QuasiRandom => "ALGORITHM_UNSPECIFIED",
            AlgorithmName::Grid => "GRID_SEARCH",
            AlgorithmName::Random => "RANDOM_SEARCH",
        },
        "measurementSelectionType": match spec.measurement_selection {
            MeasurementSelection::Last => "LAST_MEASUREMENT",
            MeasurementSelection::Best => "BEST_MEASUREMENT",
        },
    });
    if let Some(stopping) = &spec.early_stopping {
        let key = match stopping.rule {
            StoppingRuleName::Median => "medianAutomatedStoppingSpec",
            StoppingRuleName::DecayCurve => "decayCurveStoppingSpec",
        };
        study[key] = json!({"useElapsedDuration": false});
    }
    if let Some(stopping) = &spec.study_stopping {
        // Int32Value and BoolValue: plain JSON numbers and booleans. `min_delta_change` has
        // no Vertex field and is left out.
        let mut config = Map::new();
        let mut put = |key: &str, value: Option<i64>| {
            if let Some(v) = value {
                config.insert(key.into(), json!(v));
            }
        };
        put("minNumTrials", stopping.min_num_trials);
        put("maxNumTrials", stopping.max_num_trials);
        put(
            "maxNumTrialsNoProgress",
            stopping.max_num_trials_no_progress,
        );
        if let Some(secs) = stopping.max_duration_no_progress_secs {
            config.insert("maxDurationNoProgress".into(), json!(format!("{secs}s")));
        }
        if stopping.should_stop_asap {
            config.insert("shouldStopAsap".into(), json!(true));
        }
        study["studyStoppingConfig"] = Json::Object(config);
    }
    let mut job = json!({
        "displayName": spec.name,
        "maxTrialCount": spec.max_trials,
        "parallelTrialCount": spec.parallel_trials,
        "studySpec": study,
    });
    if let Some(n) = spec.max_failed_trials {
        job["maxFailedTrialCount"] = json!(n);
    }
    if let Some(trial_job) = &spec.trial_job
        && trial_job.executor.runs_images()
    {
        job["trialJobSpec"] = vertex_trial_job(trial_job);
    }
    job
}

/// A parameter value as Vertex's JSON has it: whole numbers without a point (`32`, not
/// `32.0`), other numbers as they are, categories as strings.
fn vertex_value(v: &Value) -> Json {
    match v {
        Value::Int(i) => json!(i),
        Value::Float(f) => json!(f),
        Value::Str(s) => json!(s),
    }
}

fn vertex_parameter(p: &ParameterInput) -> Json {
    let mut out = json!({"parameterId": p.id});
    let values = || {
        p.values
            .iter()
            .flatten()
            .map(vertex_value)
            .collect::<Vec<_>>()
    };
    match p.kind {
        ParameterType::Double => {
            out["doubleValueSpec"] = json!({"minValue": p.min, "maxValue": p.max});
        }
        ParameterType::Integer => {
            // Whole by validation; the cast only drops the float's `.0`.
            let int = |v: Option<f64>| v.map(|f| f as i64);
            out["integerValueSpec"] = json!({"minValue": int(p.min), "maxValue": int(p.max)});
        }
        ParameterType::Discrete => out["discreteValueSpec"] = json!({"values": values()}),
        ParameterType::Categorical => out["categoricalValueSpec"] = json!({"values": values()}),
    }
    if let Some(scale) = p.scale {
        out["scaleType"] = json!(match scale {
            ScaleName::Linear => "UNIT_LINEAR_SCALE",
            ScaleName::Log => "UNIT_LOG_SCALE",
            ScaleName::ReverseLog => "UNIT_REVERSE_LOG_SCALE",
        });
    }
    let parent_key = match p.kind {
        ParameterType::Categorical => "parentCategoricalValues",
        ParameterType::Integer => "parentIntValues",
        ParameterType::Discrete | ParameterType::Double => "parentDiscreteValues",
    };
    // Vertex has one conditional spec per child parameter: a child group of several
    // parameters becomes as many specs with the same parent values.
    let conditionals: Vec<Json> = p
        .children
        .iter()
        .flat_map(|child| {
            let when: Vec<Json> = child.when.iter().map(vertex_value).collect();
            child.parameters.iter().map(move |parameter| {
                json!({
                    parent_key: {"values": when.clone()},
                    "parameterSpec": vertex_parameter(parameter),
                })
            })
        })
        .collect();
    if !conditionals.is_empty() {
        out["conditionalParameterSpecs"] = json!(conditionals);
    }
    out
}

/// The trial job as the `job` member of the `CLUSTER_SPEC` and `TF_CONFIG` Augur gives every
/// replica: Vertex's `CustomJobSpec` JSON (`workerPoolSpecs`, `scheduling`,
/// `baseOutputDirectory`), as the export writes it, with two differences a trainer may see:
/// `replicaCount` is a string, as proto3 JSON prints an int64 (and as Vertex's own variables
/// carry it), and a pool with no image (the local and Slurm executors) has no `imageUri`.
/// The `args` are the job's, without the trial's parameter arguments (each replica's command
/// line has those), and the server's own variables (`--job-env`) are not listed.
pub fn custom_job_spec(job: &TrialJobSpec) -> Json {
    let mut spec = vertex_trial_job(job);
    if let Some(pools) = spec["workerPoolSpecs"].as_array_mut() {
        for pool in pools.iter_mut().filter_map(Json::as_object_mut) {
            if let Some(n) = pool.get("replicaCount").and_then(Json::as_u64) {
                pool.insert("replicaCount".into(), json!(n.to_string()));
            }
            if let Some(container) = pool.get_mut("containerSpec").and_then(Json::as_object_mut)
                && container.get("imageUri").and_then(Json::as_str) == Some("")
            {
                container.remove("imageUri");
            }
        }
    }
    spec
}

fn vertex_trial_job(job: &TrialJobSpec) -> Json {
    // Without worker pools a trial is one replica with everything the job's.
    let single = [Some(WorkerPoolSpec::default())];
    let pools = if job.worker_pools.is_empty() {
        &single[..]
    } else {
        &job.worker_pools[..]
    };
    let pools: Vec<Json> = pools
        .iter()
        .map(|pool| {
            pool.as_ref()
                .map_or_else(|| json!({}), |p| vertex_pool(job, p))
        })
        .collect();
    let mut out = json!({"workerPoolSpecs": pools});
    if let Some(secs) = job.timeout_secs {
        out["scheduling"] = json!({"timeout": format!("{secs}s")});
    }
    if let Some(dir) = &job.output_dir {
        // Vertex's field is a URI: a local absolute path as `file://`, which import reads back
        // as the path. Relative paths and object-store URIs (kubernetes) go as they are.
        let uri = if dir.starts_with('/') {
            format!("file://{dir}")
        } else {
            dir.clone()
        };
        out["baseOutputDirectory"] = json!({"outputUriPrefix": uri});
    }
    out
}

/// One `workerPoolSpecs` entry: what the pool's replicas run, with the job's values where
/// the pool has none of its own.
fn vertex_pool(job: &TrialJobSpec, pool: &WorkerPoolSpec) -> Json {
    let image = pool.image.as_deref().or(job.executor.image());
    let mut container = json!({"imageUri": image.unwrap_or_default()});
    let command = pool.command.as_deref().unwrap_or(&job.command);
    let args = pool.args.as_deref().unwrap_or(&job.args);
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    if !args.is_empty() {
        container["args"] = json!(args);
    }
    // A replica gets the job's variables and its pool's (which win): Vertex has one list.
    let mut env = job.env.clone();
    env.extend(pool.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    if !env.is_empty() {
        container["env"] = json!(
            env.iter()
                .map(|(k, v)| json!({"name": k, "value": v}))
                .collect::<Vec<_>>()
        );
    }
    let mut pool_json = json!({"replicaCount": pool.replicas, "containerSpec": container});
    let resources = pool.resources.as_ref().or(job.resources.as_ref());
    let machine = machine_spec(pool, resources);
    if !machine.is_empty() {
        pool_json["machineSpec"] = Json::Object(machine);
    }
    pool_json
}

/// Vertex's `machineSpec` of a pool: the machine and accelerator types it was imported with,
/// or, for a pool that has none (an Augur spec), the smallest machine that holds its
/// resources ([`covering_machine`]); `acceleratorCount` from `resources.gpu`.
fn machine_spec(pool: &WorkerPoolSpec, resources: Option<&Resources>) -> Map<String, Json> {
    let mut machine = Map::new();
    let machine_type = pool
        .machine_type
        .clone()
        .or_else(|| covering_machine(resources));
    if let Some(kind) = machine_type {
        machine.insert("machineType".into(), json!(kind));
    }
    if let Some(kind) = &pool.accelerator_type {
        machine.insert("acceleratorType".into(), json!(kind));
    }
    if let Some(gpu) = resources.and_then(|r| r.gpu).filter(|g| *g > 0) {
        machine.insert("acceleratorCount".into(), json!(gpu));
    }
    machine
}

/// Sizes of n1-standard machines for Vertex AI training, from the 4 vCPUs of its examples.
const N1_STANDARD_CPUS: [u32; 6] = [4, 8, 16, 32, 64, 96];

/// The smallest n1-standard machine with at least `resources`' CPUs and memory (Vertex
/// requires a machine type in every pool); n1-standard-4 when they ask for neither, none when
/// no n1-standard machine is large enough. n1 is the series that takes every GPU kind of
/// Vertex's older list (T4, V100, P100, P4); Vertex refuses GPUs without an
/// `acceleratorType`, which an Augur spec cannot tell.
fn covering_machine(resources: Option<&Resources>) -> Option<String> {
    let cpu = resources.and_then(|r| r.cpu).unwrap_or(0.0);
    let bytes = resources.and_then(Resources::memory_bytes).unwrap_or(0);
    N1_STANDARD_CPUS
        .iter()
        .map(|n| format!("n1-standard-{n}"))
        .find(|name| {
            machine_resources(name)
                .is_some_and(|(cpus, gib)| cpus >= cpu && gib.saturating_mul(1 << 30) >= bytes)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of Vertex's documented example (`gcloud ai hp-tuning-jobs create --config`),
    /// in the REST JSON's camelCase, with a conditional parameter and four worker pools.
    fn documented_job() -> Json {
        json!({
            "displayName": "svc-digits",
            "maxTrialCount": "40",
            "parallelTrialCount": "4",
            "maxFailedTrialCount": "5",
            "studySpec": {
                "metrics": [{"metricId": "accuracy", "goal": "MAXIMIZE"}],
                "parameters": [
                    {"parameterId": "learning_rate", "doubleValueSpec": {"minValue": 0.0001, "maxValue": 0.1}, "scaleType": "UNIT_LOG_SCALE"},
                    {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "8"}, "scaleType": "UNIT_LINEAR_SCALE"},
                    {"parameterId": "batch_size", "discreteValueSpec": {"values": [16, 32, 64]}},
                    {"parameterId": "optimizer", "categoricalValueSpec": {"values": ["adam", "sgd"]},
                     "conditionalParameterSpecs": [{
                        "parentCategoricalValues": {"values": ["sgd"]},
                        "parameterSpec": {"parameterId": "momentum", "doubleValueSpec": {"minValue": 0.0, "maxValue": 0.99}}
                     }]}
                ],
                "algorithm": "RANDOM_SEARCH",
                "measurementSelectionType": "BEST_MEASUREMENT",
                "medianAutomatedStoppingSpec": {"useElapsedDuration": false}
            },
            "trialJobSpec": {
                "workerPoolSpecs": [
                    {"machineSpec": {"machineType": "n1-standard-4", "acceleratorType": "NVIDIA_TESLA_T4", "acceleratorCount": 1},
                     "replicaCount": "1",
                     "containerSpec": {"imageUri": "us-docker.pkg.dev/p/trainer:1", "command": ["python3", "train.py"], "args": ["--epochs=10"],
                                        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}]}},
                    {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "2",
                     "containerSpec": {"imageUri": "us-docker.pkg.dev/p/trainer:1", "command": ["python3", "train.py"], "args": ["--epochs=10"]}},
                    {"machineSpec": {"machineType": "n1-highmem-2"}, "replicaCount": "1",
                     "containerSpec": {"imageUri": "us-docker.pkg.dev/p/ps:1"}},
                    {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": "1",
                     "containerSpec": {"imageUri": "us-docker.pkg.dev/p/trainer:1", "command": ["python3", "eval.py"]}}
                ],
                "scheduling": {"timeout": "7200s"},
                "baseOutputDirectory": {"outputUriPrefix": "file:///srv/runs/svc"}
            },
            "encryptionSpec": {"kmsKeyName": "projects/p/locations/l/keyRings/r/cryptoKeys/k"}
        })
    }

    #[test]
    fn a_documented_job_maps_to_the_augur_spec_it_must_produce() {
        let imported = from_vertex(&documented_job()).expect("import");
        let expected: StudySpec = serde_json::from_value(json!({
            "name": "svc-digits",
            "algorithm": "random",
            "metrics": [{"id": "accuracy", "goal": "maximize"}],
            "parameters": [
                {"id": "learning_rate", "type": "double", "min": 0.0001, "max": 0.1, "scale": "log"},
                {"id": "layers", "type": "integer", "min": 1, "max": 8, "scale": "linear"},
                {"id": "batch_size", "type": "discrete", "values": [16, 32, 64]},
                {"id": "optimizer", "type": "categorical", "values": ["adam", "sgd"],
                 "children": [{"when": ["sgd"], "parameters": [{"id": "momentum", "type": "double", "min": 0.0, "max": 0.99}]}]}
            ],
            "max_trials": 40,
            "parallel_trials": 4,
            "max_failed_trials": 5,
            "measurement_selection": "best",
            "early_stopping": {"rule": "median"},
            "trial_job": {
                "executor": "container",
                "image": "us-docker.pkg.dev/p/trainer:1",
                "command": ["python3", "train.py"],
                "args": ["--epochs=10"],
                "timeout_secs": 7200,
                "output_dir": "/srv/runs/svc",
                "worker_pools": [
                    {"replicas": 1, "env": {"PYTHONUNBUFFERED": "1"}, "resources": {"cpu": 4.0, "memory": "15Gi", "gpu": 1},
                     "machine_type": "n1-standard-4", "accelerator_type": "NVIDIA_TESLA_T4"},
                    {"replicas": 2, "resources": {"cpu": 4.0, "memory": "15Gi"}, "machine_type": "n1-standard-4"},
                    {"replicas": 1, "command": [], "args": [], "image": "us-docker.pkg.dev/p/ps:1",
                     "resources": {"cpu": 2.0, "memory": "13Gi"}, "machine_type": "n1-highmem-2"},
                    {"replicas": 1, "command": ["python3", "eval.py"], "args": [],
                     "resources": {"cpu": 4.0, "memory": "15Gi"}, "machine_type": "n1-standard-4"}
                ]
            }
        }))
        .expect("expected spec");
        assert_eq!(imported.spec, expected);
        let warned = imported.warnings.join("\n");
        assert!(warned.contains("encryptionSpec"), "{warned}");
        assert!(warned.contains("acceleratorType"), "{warned}");
    }

    #[test]
    fn snake_case_yaml_reads_like_camel_case_json() {
        let yaml = r#"
display_name: small
max_trial_count: 10
parallel_trial_count: 2
study_spec:
  metrics: [{metric_id: loss, goal: MINIMIZE}]
  parameters:
    - parameter_id: lr
      double_value_spec: {min_value: 0.001, max_value: 0.1}
      scale_type: UNIT_LOG_SCALE
  decay_curve_stopping_spec: {use_elapsed_duration: true}
"#;
        let doc: Json = yaml_serde::from_str(yaml).expect("yaml");
        let imported = from_vertex(&doc).expect("import");
        assert_eq!(imported.spec.name, "small");
        assert_eq!(imported.spec.parallel_trials, 2);
        assert_eq!(imported.spec.algorithm, AlgorithmName::GpBandit);
        assert_eq!(
            imported.spec.early_stopping.map(|e| e.rule),
            Some(StoppingRuleName::DecayCurve)
        );
        assert!(
            imported
                .warnings
                .iter()
                .any(|w| w.contains("useElapsedDuration"))
        );
    }

    /// `doc` less the fields at these JSON pointers.
    fn without(doc: &Json, pointers: &[&str]) -> Json {
        let mut doc = doc.clone();
        for pointer in pointers {
            let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
            let removed = doc
                .pointer_mut(parent)
                .and_then(Json::as_object_mut)
                .and_then(|o| o.remove(key));
            assert!(removed.is_some(), "{pointer} is in the document");
        }
        doc
    }

    /// `/trialJobSpec/workerPoolSpecs/0/diskSpec` as the import names it:
    /// `trialJobSpec.workerPoolSpecs[0].diskSpec`.
    fn dotted(pointer: &str) -> String {
        let mut out = String::new();
        for part in pointer.trim_start_matches('/').split('/') {
            if part.chars().all(|c| c.is_ascii_digit()) {
                out.push_str(&format!("[{part}]"));
            } else {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(part);
            }
        }
        out
    }

    fn example_job() -> Json {
        let text = include_str!("../../examples/vertex/hp_tuning_job.yaml");
        yaml_serde::from_str(text).expect("the example is YAML")
    }

    fn every_field_job() -> Json {
        let text = include_str!("../../tests/fixtures/vertex/every_field.json");
        serde_json::from_str(text).expect("the fixture is JSON")
    }

    /// The fixture's fields that Augur does not keep: (warned about, skipped silently).
    fn every_field_ignored() -> (Vec<String>, Vec<String>) {
        let text = include_str!("../../tests/fixtures/vertex/every_field.ignored.json");
        let doc: Json = serde_json::from_str(text).expect("JSON");
        let list = |key: &str| -> Vec<String> {
            doc[key]
                .as_array()
                .expect("a list")
                .iter()
                .filter_map(|p| p.as_str().map(str::to_string))
                .collect()
        };
        (list("warned"), list("output_only"))
    }

    /// Import, export, import: the export is the document imported, field for field and
    /// type for type (numbers as numbers, `args` apart from `command`, the machine types),
    /// less the fields the import warned it ignores (`warned`, each named in a warning) and
    /// the output-only ones; and the second import is the first spec, whole.
    fn assert_round_trip(doc: &Json, warned: &[String], output_only: &[String]) {
        let first = from_vertex(doc).expect("import");
        for pointer in warned {
            let field = dotted(pointer);
            assert!(
                first.warnings.iter().any(|w| w.starts_with(&field)),
                "a warning names {field}: {:?}",
                first.warnings
            );
        }
        let exported = to_vertex(&first.spec);
        let dropped: Vec<&str> = warned
            .iter()
            .chain(output_only)
            .map(String::as_str)
            .collect();
        assert_eq!(
            exported,
            without(doc, &dropped),
            "exported:\n{}",
            serde_json::to_string_pretty(&exported).unwrap_or_default()
        );
        let second = from_vertex(&exported).expect("re-import");
        assert_eq!(second.spec, first.spec);
    }

    #[test]
    fn the_example_exports_as_it_was_imported() {
        assert_round_trip(&example_job(), &[], &[]);
    }

    #[test]
    fn a_job_with_every_field_exports_as_it_was_imported() {
        let (warned, output_only) = every_field_ignored();
        assert_round_trip(&every_field_job(), &warned, &output_only);
    }

    /// What the fixture's round trip cannot show, as its own cases: the other choices of
    /// each enum, and a job whose pools share nothing.
    #[test]
    fn each_algorithm_selection_and_stopping_rule_exports_as_it_was_imported() {
        let (warned, output_only) = every_field_ignored();
        let dropped: Vec<&str> = warned
            .iter()
            .chain(&output_only)
            .map(String::as_str)
            .collect();
        let base = without(&every_field_job(), &dropped);
        type Change<'a> = &'a dyn Fn(&mut Json);
        let changes: Vec<Change<'_>> = vec![
            &|d| d["studySpec"]["algorithm"] = json!("GRID_SEARCH"),
            &|d| d["studySpec"]["algorithm"] = json!("ALGORITHM_UNSPECIFIED"),
            &|d| d["studySpec"]["measurementSelectionType"] = json!("LAST_MEASUREMENT"),
            &|d| {
                let study = d["studySpec"].as_object_mut().expect("studySpec");
                study.remove("medianAutomatedStoppingSpec");
                study.insert(
                    "decayCurveStoppingSpec".into(),
                    json!({"useElapsedDuration": false}),
                );
            },
            &|d| {
                d["studySpec"]
                    .as_object_mut()
                    .map(|s| s.remove("medianAutomatedStoppingSpec"));
            },
            // Every pool its own image, command and args; the primary with no args at all.
            &|d| {
                d["trialJobSpec"]["workerPoolSpecs"] = json!([
                    {"machineSpec": {"machineType": "e2-standard-4"}, "replicaCount": 1,
                     "containerSpec": {"imageUri": "localhost/chief:1", "command": ["/app/chief"]}},
                    {"machineSpec": {"machineType": "e2-highcpu-16"}, "replicaCount": 4,
                     "containerSpec": {"imageUri": "localhost/worker:1", "command": ["/app/worker"], "args": ["--fast"]}}
                ]);
                d["trialJobSpec"]["baseOutputDirectory"]["outputUriPrefix"] =
                    json!("runs/relative");
            },
        ];
        for (i, change) in changes.into_iter().enumerate() {
            let mut doc = base.clone();
            change(&mut doc);
            let first = from_vertex(&doc).unwrap_or_else(|e| panic!("case {i}: {e}"));
            assert_eq!(to_vertex(&first.spec), doc, "case {i}");
        }
    }

    #[test]
    fn args_stay_apart_from_the_command_and_machine_types_are_kept() {
        let spec = from_vertex(&every_field_job()).expect("import").spec;
        let job = spec.trial_job.expect("trial_job");
        assert_eq!(job.command, ["python3", "-m", "trainer.task"]);
        assert_eq!(job.args, ["--epochs=20", "--data=/data/imagenet"]);
        let pools: Vec<&WorkerPoolSpec> = job.worker_pools.iter().flatten().collect();
        // The evaluator runs its image's entrypoint with its own args.
        assert_eq!(pools[2].command.as_deref(), Some(&[][..]));
        assert_eq!(
            pools[2].args.as_deref(),
            Some(
                &[
                    "--mode=eval".to_string(),
                    "--data=/data/imagenet".to_string()
                ][..]
            )
        );
        assert_eq!(pools[0].machine_type.as_deref(), Some("n1-standard-8"));
        assert_eq!(
            pools[0].accelerator_type.as_deref(),
            Some("NVIDIA_TESLA_T4")
        );
        // Executors get resources: n1-standard-8 is 8 vCPUs and 30 GiB; a2-highgpu-1g is
        // not in the table, so only its GPU count is known.
        let r = pools[0].resources.clone().expect("resources");
        assert_eq!(
            (r.cpu, r.memory.as_deref(), r.gpu),
            (Some(8.0), Some("30Gi"), Some(2))
        );
        assert_eq!(
            pools[2].resources,
            Some(Resources {
                gpu: Some(1),
                ..Default::default()
            })
        );
    }

    /// An Augur spec without machine types (written for Augur, not imported) exports the
    /// smallest n1-standard machine that holds each pool's resources, since Vertex requires
    /// a machine type; the job's own env and resources reach every pool.
    #[test]
    fn a_native_spec_exports_a_machine_type_vertex_accepts() {
        let spec: StudySpec = serde_json::from_value(json!({
            "name": "native",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [{"id": "lr", "type": "double", "min": 0.001, "max": 0.1}],
            "max_trials": 5,
            "trial_job": {
                "executor": "container",
                "image": "localhost/trainer:1",
                "command": ["python3", "train.py"],
                "env": {"MODE": "fast"},
                "resources": {"cpu": 6, "memory": "20Gi"},
                "worker_pools": [
                    {"replicas": 1, "env": {"MODE": "chief", "EXTRA": "1"}},
                    {"replicas": 2, "resources": {"gpu": 1}},
                    {"replicas": 1, "resources": {"cpu": 200}}
                ]
            }
        }))
        .expect("spec");
        let pools = &to_vertex(&spec)["trialJobSpec"]["workerPoolSpecs"];
        assert_eq!(
            pools[0]["machineSpec"],
            json!({"machineType": "n1-standard-8"})
        );
        assert_eq!(
            pools[0]["containerSpec"]["env"],
            json!([{"name": "EXTRA", "value": "1"}, {"name": "MODE", "value": "chief"}])
        );
        assert_eq!(
            pools[1]["machineSpec"],
            json!({"machineType": "n1-standard-4", "acceleratorCount": 1})
        );
        assert_eq!(
            pools[1]["containerSpec"]["env"],
            json!([{"name": "MODE", "value": "fast"}])
        );
        // Larger than any n1-standard machine: no machine type is made up.
        assert_eq!(pools[2].get("machineSpec"), None);
    }

    #[test]
    fn bad_vertex_specs_name_the_field_in_vertexs_terms() {
        let with = |f: &dyn Fn(&mut Json)| {
            let mut doc = documented_job();
            f(&mut doc);
            from_vertex(&doc).map(|_| ()).map_err(|e| e.field)
        };
        type Change<'a> = &'a dyn Fn(&mut Json);
        let cases: Vec<(Change<'_>, &str)> = vec![
            (
                &|d| {
                    d["studySpec"]["studyStoppingConfig"] =
                        json!({"maximumRuntimeConstraint": {"maxDuration": "3600s"}})
                },
                "studySpec.studyStoppingConfig.maximumRuntimeConstraint",
            ),
            (
                &|d| {
                    d["studySpec"]["studyStoppingConfig"] =
                        json!({"minNumTrials": 9, "maxNumTrials": 3})
                },
                "studySpec.studyStoppingConfig.minNumTrials",
            ),
            (
                &|d| {
                    d["studySpec"]["studyStoppingConfig"] = json!({"maxDurationNoProgress": "soon"})
                },
                "studySpec.studyStoppingConfig.maxDurationNoProgress",
            ),
            (
                &|d| d["studySpec"]["studyStoppingConfig"] = json!({"maxNumTrialsNoProgress": 0}),
                "studySpec.studyStoppingConfig.maxNumTrialsNoProgress",
            ),
            (
                &|d| d["studySpec"]["parameters"][0]["scaleType"] = json!("UNIT_CUBIC_SCALE"),
                "studySpec.parameters[0].scaleType",
            ),
            (
                &|d| d["studySpec"]["parameters"][1]["integerValueSpec"]["minValue"] = json!("one"),
                "studySpec.parameters[1].integerValueSpec.minValue",
            ),
            (
                &|d| d["studySpec"]["parameters"][2] = json!({"parameterId": "x"}),
                "studySpec.parameters[2].doubleValueSpec",
            ),
            (
                &|d| d["studySpec"]["metrics"][0]["goal"] = json!("BIGGER"),
                "studySpec.metrics[0].goal",
            ),
            (
                &|d| {
                    d["studySpec"]["metrics"][0]["safetyConfig"] =
                        json!({"desiredMinSafeTrialsFraction": 0.5})
                },
                "studySpec.metrics[0].safetyConfig.safetyThreshold",
            ),
            (
                &|d| d["studySpec"]["algorithm"] = json!("BAYESIAN"),
                "studySpec.algorithm",
            ),
            (
                &|d| d["studySpec"]["convexAutomatedStoppingSpec"] = json!({}),
                "studySpec.convexAutomatedStoppingSpec",
            ),
            (
                &|d| {
                    d["trialJobSpec"]["workerPoolSpecs"][1] =
                        json!({"replicaCount": "1", "pythonPackageSpec": {}})
                },
                "trialJobSpec.workerPoolSpecs[1].pythonPackageSpec",
            ),
            (
                &|d| {
                    d["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"] =
                        json!({"command": ["x"]})
                },
                "trialJobSpec.workerPoolSpecs[0].containerSpec.imageUri",
            ),
            (
                &|d| d["trialJobSpec"]["scheduling"]["timeout"] = json!("2h"),
                "trialJobSpec.scheduling.timeout",
            ),
            (
                &|d| {
                    d.as_object_mut().map(|o| o.remove("maxTrialCount"));
                },
                "maxTrialCount",
            ),
            (
                &|d| {
                    d["trialJobSpec"]["workerPoolSpecs"][1]["machineSpec"]["machineType"] =
                        json!("N1 STANDARD 4")
                },
                "trialJobSpec.workerPoolSpecs[1].machineSpec.machineType",
            ),
            (
                &|d| {
                    d["trialJobSpec"]["workerPoolSpecs"][0]["machineSpec"]["acceleratorType"] =
                        json!("nvidia-t4")
                },
                "trialJobSpec.workerPoolSpecs[0].machineSpec.acceleratorType",
            ),
            (
                &|d| {
                    d["trialJobSpec"]["workerPoolSpecs"][0]["containerSpec"]["args"] =
                        json!(["--ok", 3])
                },
                "trialJobSpec.workerPoolSpecs[0].containerSpec.args[1]",
            ),
            // What Vertex accepts and Augur does not, named in Augur's terms.
            (
                &|d| d["trialJobSpec"]["workerPoolSpecs"][0]["replicaCount"] = json!("2"),
                "trial_job.worker_pools[0].replicas",
            ),
        ];
        for (i, (change, field)) in cases.into_iter().enumerate() {
            assert_eq!(with(change), Err(field.to_string()), "case {i}");
        }
    }
}
