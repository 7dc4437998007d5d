//! `trial_job`: how the service itself runs each trial (DESIGN §2, §4), and how a trial's
//! values become its command line.

use std::collections::BTreeMap;

use augur_optimizer::{Assignment, Value};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;
use super::executor::{
    ExecutorFields, ExecutorName, ExecutorSpec, KubernetesOptions, SlurmOptions,
};
use crate::model::TrialId;

/// Where a study's trial directories are in its `output_dir`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputLayout {
    /// `<output_dir>/study-<id>-<created, YYYYMMDDTHHMMSS>/<trial>`: studies that share an
    /// `output_dir` share nothing, nor does a study of another database with the same id.
    #[default]
    Study,
    /// `<output_dir>/study-<id>/<trial>`: the layout of studies without an `output_dir`
    /// before the created time joined the name (set on them by the upgrade).
    StudyId,
    /// `<output_dir>/<trial>`: one study per `output_dir` (Vertex AI's layout; set by the
    /// upgrade on studies from before the per-study layout that had an `output_dir`).
    Trial,
}

impl OutputLayout {
    fn is_default(&self) -> bool {
        *self == OutputLayout::Study
    }
}

/// How parameter values are written on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArgStyle {
    /// `--lr=0.01` (the default; what Vertex AI passes)
    #[default]
    Equals,
    /// `--lr 0.01` (two arguments)
    Space,
    /// `lr=0.01`
    KeyValue,
    /// `++lr=0.01` (Hydra: add or override)
    Hydra,
}

/// What one replica may use (DESIGN §2 `resources`). Local replicas get `gpu` distinct GPUs
/// of the machine through `CUDA_VISIBLE_DEVICES`; Slurm asks for `cpu`/`memory`/`gpu` per
/// task; containers and pods get them as limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPUs (fractions allowed where the executor can, e.g. 0.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// Memory as Kubernetes writes it: `16Gi`, `512Mi`, `8G`, or bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Whole GPUs, each given to this replica alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
}

impl Resources {
    /// `memory` in bytes, when given.
    pub fn memory_bytes(&self) -> Option<u64> {
        self.memory.as_deref().and_then(parse_memory)
    }

    fn validate(&self, field: &str) -> Result<(), ValidationError> {
        if self
            .cpu
            .is_some_and(|c| !(c.is_finite() && c > 0.0 && c <= 1024.0))
        {
            return Err(ValidationError::new(
                format!("{field}.cpu"),
                "must be a number of CPUs above 0 (at most 1024)",
            ));
        }
        if let Some(m) = &self.memory
            && parse_memory(m).is_none_or(|b| b == 0)
        {
            return Err(ValidationError::new(
                format!("{field}.memory"),
                "must be a size such as 512Mi, 16Gi, 8G or a number of bytes",
            ));
        }
        if self.gpu.is_some_and(|g| g > 64) {
            return Err(ValidationError::new(
                format!("{field}.gpu"),
                "must be at most 64",
            ));
        }
        Ok(())
    }
}

/// `16Gi`, `512Mi`, `8G`, `1000` → bytes (Kubernetes' binary and decimal suffixes).
fn parse_memory(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// One worker pool of a training cluster (DESIGN §4.1), as Vertex AI's `workerPoolSpecs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerPoolSpec {
    /// Replicas in this pool; pool 0 (the primary) has exactly one.
    #[serde(default = "one_replica")]
    pub replicas: u32,
    /// This pool's program and arguments; the trial job's `command` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// This pool's arguments after its command; the trial job's `args` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Added to the trial job's `env` for this pool's replicas.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Per replica of this pool; the trial job's `resources` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// This pool's container image (container and kubernetes executors); the trial job's
    /// `image` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Vertex AI's `machineSpec.machineType` (`n1-standard-4`), kept so that an imported job
    /// exports as it came. No executor reads it: replicas get `resources` (which the import
    /// derives from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_type: Option<String>,
    /// Vertex AI's `machineSpec.acceleratorType` (`NVIDIA_TESLA_T4`), kept for export like
    /// `machine_type`; replicas get `resources.gpu` GPUs of whatever kind the machine has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_type: Option<String>,
}

impl Default for WorkerPoolSpec {
    /// One replica running the trial job's command, image, environment and resources.
    fn default() -> Self {
        WorkerPoolSpec {
            replicas: one_replica(),
            command: None,
            args: None,
            env: BTreeMap::new(),
            resources: None,
            image: None,
            machine_type: None,
            accelerator_type: None,
        }
    }
}

fn one_replica() -> u32 {
    1
}

/// Longest `machine_type` and `accelerator_type` (Vertex's are about 20 characters).
const MAX_MACHINE_NAME_LEN: usize = 64;

/// A Compute Engine machine type as Vertex AI names it: lowercase words of letters and
/// digits joined by `-`, the first a series (`n1-standard-4`, `a2-highgpu-1g`, `cloud-tpu`).
pub(super) fn check_machine_type(name: &str, field: &str) -> Result<(), ValidationError> {
    let words_ok = name.split('-').all(|w| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    });
    let ok = name.len() <= MAX_MACHINE_NAME_LEN
        && name.contains('-')
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && words_ok;
    if ok {
        return Ok(());
    }
    Err(ValidationError::new(
        field,
        format!(
            "must be a machine type such as n1-standard-4 (at most {MAX_MACHINE_NAME_LEN} \
             lowercase letters, digits and '-')"
        ),
    ))
}

/// An accelerator as Vertex AI's `AcceleratorType` enum names it (`NVIDIA_TESLA_T4`,
/// `TPU_V3`): new kinds appear often, so any name of that form is kept.
pub(super) fn check_accelerator_type(name: &str, field: &str) -> Result<(), ValidationError> {
    let ok = name.len() <= MAX_MACHINE_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if ok {
        return Ok(());
    }
    Err(ValidationError::new(
        field,
        format!(
            "must be an accelerator type such as NVIDIA_TESLA_T4 (at most \
             {MAX_MACHINE_NAME_LEN} uppercase letters, digits and '_')"
        ),
    ))
}

/// At most four pools: primary, workers, parameter (or reduction) servers, evaluators.
pub const MAX_WORKER_POOLS: usize = 4;
/// Replicas one pool may ask for.
pub const MAX_REPLICAS_PER_POOL: u32 = 256;
/// Variables Augur sets for the replicas of a cluster: a spec may not set them itself.
pub const CLUSTER_ENV: [&str; 8] = [
    "CLUSTER_SPEC",
    "TF_CONFIG",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "CUDA_VISIBLE_DEVICES",
];

/// One replica of a trial's cluster: pool 0 index 0 is the primary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaId {
    pub pool: usize,
    pub index: usize,
}

impl ReplicaId {
    pub const PRIMARY: ReplicaId = ReplicaId { pool: 0, index: 0 };

    pub fn is_primary(self) -> bool {
        self == Self::PRIMARY
    }

    /// `workerpool1-2`: Vertex's pool name and the replica's index.
    pub fn name(self) -> String {
        format!("workerpool{}-{}", self.pool, self.index)
    }

    /// The inverse of [`ReplicaId::name`].
    pub fn parse(name: &str) -> Option<ReplicaId> {
        let (pool, index) = name.strip_prefix("workerpool")?.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
        if !digits(pool) || !digits(index) {
            return None;
        }
        Some(ReplicaId {
            pool: pool.parse().ok()?,
            index: index.parse().ok()?,
        })
    }
}

/// One replica as the executor runs it: its place, program, extra environment, resources.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaPlan<'a> {
    pub id: ReplicaId,
    pub command: &'a [String],
    /// Arguments after `command`, before the values.
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub resources: Option<&'a Resources>,
    /// The image it runs, where the executor runs images.
    pub image: Option<&'a str>,
}

/// How the service runs each trial of a study (DESIGN §2, §4). Read and written as
/// [`TrialJobFields`], what users write and the store keeps, with the executor's fields as
/// one [`ExecutorSpec`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "TrialJobFields", into = "TrialJobFields")]
pub struct TrialJobSpec {
    /// Where the replicas run, with that executor's options.
    pub executor: ExecutorSpec,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub arg_style: ArgStyle,
    pub boolean_flags: bool,
    pub workdir: Option<String>,
    pub env: BTreeMap<String, String>,
    pub timeout_secs: Option<u64>,
    pub max_retries: u32,
    pub output_dir: Option<String>,
    pub output_layout: OutputLayout,
    pub metric_regex: Option<String>,
    pub resources: Option<Resources>,
    pub worker_pools: Vec<Option<WorkerPoolSpec>>,
}

// `trial_job` as written: the fields of `TrialJobSpec` are documented here, its schema in
// `openapi.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrialJobFields {
    #[serde(default)]
    pub executor: ExecutorName,
    /// The program and its fixed arguments (for the container and kubernetes executors, empty
    /// or arguments only: the image's entrypoint runs them). Values are appended as `--<id>=<value>` unless
    /// an argument is exactly `${args}` (replaced by them) or the arguments name values with
    /// `${<parameter id>}`, `${trial_id}`, `${params_file}` (a JSON file of the values).
    pub command: Vec<String>,
    /// Arguments after `command`, before the values (Vertex AI's `containerSpec.args`): a
    /// replica runs `command`, then `args`, then the values; placeholders work here too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default)]
    pub arg_style: ArgStyle,
    /// Categorical parameters whose values are `"true"`/`"false"` become bare flags
    /// (`--fp16` when true, nothing when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub boolean_flags: bool,
    /// Working directory of the job (default: the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A run longer than this is killed (with its whole process group) and retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Re-runs after a crash, timeout or lost node: same trial, same checkpoint directory.
    #[serde(default)]
    pub max_retries: u32,
    /// Base of the per-trial directories
    /// `<output_dir>/study-<id>-<created>/<trial>/{model,checkpoints,logs}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<String>,
    /// Where in `output_dir` the trials' directories are: `study` (the default,
    /// `<output_dir>/study-<id>-<created>/<trial>`), `trial` (`<output_dir>/<trial>`, Vertex
    /// AI's), or `study_id` (`<output_dir>/study-<id>/<trial>`); the upgrade sets the last two
    /// on studies from before, so their trials keep their directories.
    #[serde(default, skip_serializing_if = "OutputLayout::is_default")]
    pub output_layout: OutputLayout,
    /// Regex for metrics printed on stdout, with groups `name` and `value`
    /// (default: Katib's `name=value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmOptions>,
    /// Per replica, unless its pool says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// The container image every replica runs (container and kubernetes executors), a
    /// reference by the registries' grammar (`[registry[:port]/]path[:tag][@digest]`); the
    /// command and arguments run in it as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesOptions>,
    /// With `executor: pool`, the pool whose workers run this study's trials (`augur worker
    /// --pool NAME`); created when a study or a worker first names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// With `executor: pool`, this study's weight in the pool's fair share (default 1; above
    /// 0, at most 1000): a free slot goes to the study with the fewest running trials per
    /// unit of weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_weight: Option<f64>,
    /// Each trial a training cluster (DESIGN §4.1): pool 0 the primary (one replica), pools
    /// 1-3 workers, parameter servers, evaluators; `null` skips a pool. Absent: one replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<Option<WorkerPoolSpec>>)]
    pub worker_pools: Vec<Option<WorkerPoolSpec>>,
}

impl TryFrom<TrialJobFields> for TrialJobSpec {
    type Error = String;

    fn try_from(f: TrialJobFields) -> Result<Self, String> {
        let executor = ExecutorSpec::try_from(ExecutorFields {
            executor: f.executor,
            slurm: f.slurm,
            kubernetes: f.kubernetes,
            image: f.image,
            pool: f.pool,
            pool_weight: f.pool_weight,
        })?;
        Ok(TrialJobSpec {
            executor,
            command: f.command,
            args: f.args,
            arg_style: f.arg_style,
            boolean_flags: f.boolean_flags,
            workdir: f.workdir,
            env: f.env,
            timeout_secs: f.timeout_secs,
            max_retries: f.max_retries,
            output_dir: f.output_dir,
            output_layout: f.output_layout,
            metric_regex: f.metric_regex,
            resources: f.resources,
            worker_pools: f.worker_pools,
        })
    }
}

impl From<TrialJobSpec> for TrialJobFields {
    fn from(job: TrialJobSpec) -> Self {
        let ExecutorFields {
            executor,
            slurm,
            kubernetes,
            image,
            pool,
            pool_weight,
        } = job.executor.into();
        TrialJobFields {
            executor,
            command: job.command,
            args: job.args,
            arg_style: job.arg_style,
            boolean_flags: job.boolean_flags,
            workdir: job.workdir,
            env: job.env,
            timeout_secs: job.timeout_secs,
            max_retries: job.max_retries,
            output_dir: job.output_dir,
            output_layout: job.output_layout,
            metric_regex: job.metric_regex,
            slurm,
            resources: job.resources,
            image,
            kubernetes,
            pool,
            pool_weight,
            worker_pools: job.worker_pools,
        }
    }
}

// Its schema is the one of what is written.
impl utoipa::PartialSchema for TrialJobSpec {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <TrialJobFields as utoipa::PartialSchema>::schema()
    }
}

impl ToSchema for TrialJobSpec {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <TrialJobFields as ToSchema>::schemas(schemas);
    }
}

/// Variables of the server's (or worker's) own environment that every job inherits: what a
/// program needs to find its tools and speak the user's language, nothing that could hold a
/// secret (DESIGN §4). A job starts from these (and `LC_*`), its spec's `env`, the names the
/// server passes on (`--job-env`) and the variables Augur sets; never from the rest.
pub const INHERITED_ENV: [&str; 10] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
];

/// Whether a variable of the server's environment is one every job inherits.
pub fn is_inherited_env(name: &str) -> bool {
    INHERITED_ENV.contains(&name) || name.starts_with("LC_")
}

/// Names a spec may give a job's variables: valid, and none of those Augur sets itself.
fn check_env_names(env: &BTreeMap<String, String>, field: &str) -> Result<(), ValidationError> {
    for key in env.keys() {
        let ok = !key.is_empty()
            && !key.contains('=')
            && !key.contains('\0')
            && !key.starts_with("AUGUR_")
            && !key.starts_with("AIP_")
            && !key.starts_with("CLOUD_ML_");
        if !ok {
            return Err(ValidationError::new(
                format!("{field}.{key}"),
                "not a valid variable name, or one Augur sets itself (AUGUR_*, AIP_*, CLOUD_ML_*)",
            ));
        }
    }
    Ok(())
}

/// Katib's default stdout metric format: `accuracy=0.91` anywhere on a line.
pub const DEFAULT_METRIC_REGEX: &str =
    r"(?P<name>[A-Za-z_][\w.-]*)\s*=\s*(?P<value>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)";

const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

impl TrialJobSpec {
    pub fn validate(&self) -> Result<(), ValidationError> {
        let field = |f: &str| format!("trial_job.{f}");
        self.validate_images()?;
        if self.output_layout == OutputLayout::Trial && self.output_dir.is_none() {
            return Err(ValidationError::new(
                field("output_layout"),
                "trial (<output_dir>/<trial>) needs an output_dir; without one each study has \
                 augur-runs/study-<id>",
            ));
        }
        if matches!(self.executor, ExecutorSpec::Kubernetes { .. })
            && let Some(field) = self.params_file_field()
        {
            // The file is written on the server's disk, which pods do not see.
            return Err(ValidationError::new(
                field,
                "${params_file} is not available with executor: kubernetes (the file is on \
                 the server's disk); pass values as arguments or ${<parameter id>}",
            ));
        }
        self.executor.validate(self.output_dir.as_deref())?;
        // An image's entrypoint may be the program: then the command holds only arguments.
        let needs_program = !self.executor.runs_images();
        if needs_program && self.command.first().is_none_or(|c| c.trim().is_empty()) {
            return Err(ValidationError::new(
                field("command"),
                "must name a program",
            ));
        }
        if self
            .timeout_secs
            .is_some_and(|t| t == 0 || t > MAX_TIMEOUT_SECS)
        {
            return Err(ValidationError::new(
                field("timeout_secs"),
                "must be between 1 and 31536000",
            ));
        }
        if self.max_retries > 100 {
            return Err(ValidationError::new(
                field("max_retries"),
                "must be at most 100",
            ));
        }
        check_env_names(&self.env, "trial_job.env")?;
        if let Some(re) = &self.metric_regex {
            let compiled = regex::Regex::new(re).map_err(|e| {
                ValidationError::new(field("metric_regex"), format!("invalid regex: {e}"))
            })?;
            let names: Vec<&str> = compiled.capture_names().flatten().collect();
            if !names.contains(&"name") || !names.contains(&"value") {
                return Err(ValidationError::new(
                    field("metric_regex"),
                    "needs named groups `name` and `value`",
                ));
            }
        }
        if let Some(resources) = &self.resources {
            resources.validate(&field("resources"))?;
        }
        self.validate_worker_pools()
    }

    /// The command or arguments (the job's or a pool's) that name `${params_file}`, if any.
    fn params_file_field(&self) -> Option<String> {
        let names = |c: &[String]| c.iter().any(|a| a.contains("${params_file}"));
        let own = [("command", &self.command), ("args", &self.args)];
        if let Some((key, _)) = own.iter().find(|(_, words)| names(words)) {
            return Some(format!("trial_job.{key}"));
        }
        self.worker_pools.iter().enumerate().find_map(|(p, pool)| {
            let pool = pool.as_ref()?;
            [("command", &pool.command), ("args", &pool.args)]
                .into_iter()
                .find(|(_, words)| words.as_deref().is_some_and(names))
                .map(|(key, _)| format!("trial_job.worker_pools[{p}].{key}"))
        })
    }

    /// Whether some replica's command line names `${params_file}`: then each trial's values
    /// are written to that file before it starts.
    pub fn uses_params_file(&self) -> bool {
        self.params_file_field().is_some()
    }

    /// An image for every replica where the executor runs images, none where it does not.
    fn validate_images(&self) -> Result<(), ValidationError> {
        let job_image = self.executor.image().map(str::to_string);
        let images = std::iter::once(("trial_job.image".to_string(), &job_image)).chain(
            self.worker_pools
                .iter()
                .enumerate()
                .filter_map(|(p, pool)| {
                    Some((
                        format!("trial_job.worker_pools[{p}].image"),
                        &pool.as_ref()?.image,
                    ))
                }),
        );
        for (field, image) in images {
            let Some(image) = image else { continue };
            if !self.executor.runs_images() {
                return Err(ValidationError::new(
                    field,
                    "applies to executors that run images: container, kubernetes",
                ));
            }
            // The engine is given it as an argument: only a reference by the grammar
            // (never an option such as `--privileged`).
            if let Err(why) = super::image::ImageRef::parse(image) {
                return Err(ValidationError::new(
                    field,
                    format!("must be an image reference ([registry/]path[:tag][@digest]): {why}"),
                ));
            }
        }
        if self.executor.runs_images() {
            let missing = self.replicas().iter().any(|r| r.image.is_none());
            if missing {
                return Err(ValidationError::new(
                    "trial_job.image",
                    "the container and kubernetes executors run an image: give one",
                ));
            }
        }
        Ok(())
    }

    fn validate_worker_pools(&self) -> Result<(), ValidationError> {
        let pools = &self.worker_pools;
        if pools.is_empty() {
            return Ok(());
        }
        if pools.len() > MAX_WORKER_POOLS {
            return Err(ValidationError::new(
                "trial_job.worker_pools",
                "at most 4 pools: the primary, workers, parameter servers, evaluators",
            ));
        }
        match pools.first() {
            Some(Some(primary)) if primary.replicas == 1 => {}
            Some(Some(_)) => {
                return Err(ValidationError::new(
                    "trial_job.worker_pools[0].replicas",
                    "pool 0 is the primary replica: exactly 1",
                ));
            }
            _ => {
                return Err(ValidationError::new(
                    "trial_job.worker_pools[0]",
                    "pool 0 (the primary) is required",
                ));
            }
        }
        if pools.last().is_some_and(Option::is_none) {
            return Err(ValidationError::new(
                format!("trial_job.worker_pools[{}]", pools.len() - 1),
                "a skipped pool (null) may only stand before another pool",
            ));
        }
        for (p, pool) in pools.iter().enumerate() {
            let Some(pool) = pool else { continue };
            let field = |f: &str| format!("trial_job.worker_pools[{p}].{f}");
            if !(1..=MAX_REPLICAS_PER_POOL).contains(&pool.replicas) {
                return Err(ValidationError::new(
                    field("replicas"),
                    "must be between 1 and 256 (skip a pool with null)",
                ));
            }
            if let Some(command) = &pool.command
                && !self.executor.runs_images()
                && command.first().is_none_or(|c| c.trim().is_empty())
            {
                return Err(ValidationError::new(
                    field("command"),
                    "must name a program",
                ));
            }
            check_env_names(&pool.env, &field("env"))?;
            if let Some(resources) = &pool.resources {
                resources.validate(&field("resources"))?;
            }
            if let Some(machine) = &pool.machine_type {
                check_machine_type(machine, &field("machine_type"))?;
            }
            if let Some(accelerator) = &pool.accelerator_type {
                check_accelerator_type(accelerator, &field("accelerator_type"))?;
            }
        }
        // A cluster's replicas learn their place from these: the spec may not set them.
        for (scope, env) in std::iter::once(("trial_job.env".to_string(), &self.env)).chain(
            pools.iter().enumerate().filter_map(|(p, pool)| {
                Some((
                    format!("trial_job.worker_pools[{p}].env"),
                    &pool.as_ref()?.env,
                ))
            }),
        ) {
            if let Some(key) = env.keys().find(|k| CLUSTER_ENV.contains(&k.as_str())) {
                return Err(ValidationError::new(
                    format!("{scope}.{key}"),
                    "Augur sets this for every replica of a cluster",
                ));
            }
        }
        Ok(())
    }

    /// Whether each trial is a cluster (`worker_pools` given), even of one replica: then every
    /// replica gets the cluster's configuration (`CLUSTER_SPEC`, `TF_CONFIG`, …).
    pub fn is_cluster(&self) -> bool {
        !self.worker_pools.is_empty()
    }

    /// Every replica of a trial, the primary first, then pool by pool.
    pub fn replicas(&self) -> Vec<ReplicaPlan<'_>> {
        if self.worker_pools.is_empty() {
            return vec![ReplicaPlan {
                id: ReplicaId::PRIMARY,
                command: &self.command,
                args: &self.args,
                env: &self.env,
                resources: self.resources.as_ref(),
                image: self.executor.image(),
            }];
        }
        let mut out = Vec::new();
        for (pool, spec) in self.worker_pools.iter().enumerate() {
            let Some(spec) = spec else { continue };
            for index in 0..spec.replicas as usize {
                out.push(ReplicaPlan {
                    id: ReplicaId { pool, index },
                    command: spec.command.as_deref().unwrap_or(&self.command),
                    args: spec.args.as_deref().unwrap_or(&self.args),
                    env: &spec.env,
                    resources: spec.resources.as_ref().or(self.resources.as_ref()),
                    image: spec.image.as_deref().or(self.executor.image()),
                });
            }
        }
        out
    }

    /// The argv of one trial: the command and its `args` with placeholders filled in, and
    /// the values appended in `arg_style` unless placed by a placeholder. Never passes
    /// through a shell.
    pub fn render_argv(
        &self,
        parameters: &Assignment,
        trial_id: TrialId,
        params_file: &str,
    ) -> Vec<String> {
        self.render_command(&self.command, &self.args, parameters, trial_id, params_file)
    }

    /// [`TrialJobSpec::render_argv`] of another command and arguments (a worker pool's).
    pub fn render_command(
        &self,
        command: &[String],
        args: &[String],
        parameters: &Assignment,
        trial_id: TrialId,
        params_file: &str,
    ) -> Vec<String> {
        let mut out = Vec::with_capacity(command.len() + args.len() + parameters.len());
        let mut placed = false;
        for arg in command.iter().chain(args) {
            if arg == "${args}" {
                out.extend(self.value_args(parameters));
                placed = true;
                continue;
            }
            let (rendered, used) = substitute(arg, parameters, trial_id, params_file);
            placed |= used;
            out.push(rendered);
        }
        if !placed {
            out.extend(self.value_args(parameters));
        }
        out
    }

    fn value_args(&self, parameters: &Assignment) -> Vec<String> {
        let mut out = Vec::new();
        for (id, value) in parameters {
            let text = value_text(value);
            if self.boolean_flags && matches!(value, Value::Str(s) if s == "true" || s == "false") {
                if text == "true" {
                    out.push(match self.arg_style {
                        ArgStyle::Equals | ArgStyle::Space => format!("--{id}"),
                        ArgStyle::KeyValue => id.clone(),
                        ArgStyle::Hydra => format!("++{id}=true"),
                    });
                }
                continue;
            }
            match self.arg_style {
                ArgStyle::Equals => out.push(format!("--{id}={text}")),
                ArgStyle::Space => {
                    out.push(format!("--{id}"));
                    out.push(text);
                }
                ArgStyle::KeyValue => out.push(format!("{id}={text}")),
                ArgStyle::Hydra => out.push(format!("++{id}={text}")),
            }
        }
        out
    }
}

/// A value as a command-line word: integers without a point, floats in shortest form,
/// categoricals as given.
pub fn value_text(value: &Value) -> String {
    match value {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Str(s) => s.clone(),
    }
}

/// Replace `${id}`, `${trial_id}` and `${params_file}` in one argument. Returns whether a
/// parameter value or the params file was placed (then values are not appended).
fn substitute(
    arg: &str,
    parameters: &Assignment,
    trial_id: TrialId,
    params_file: &str,
) -> (String, bool) {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    let mut used = false;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let name = &after[..end];
        match name {
            "trial_id" => out.push_str(&trial_id.to_string()),
            "params_file" => {
                out.push_str(params_file);
                used = true;
            }
            // An inactive conditional parameter's placeholder becomes empty.
            _ => {
                if let Some(v) = parameters.get(name) {
                    out.push_str(&value_text(v));
                    used = true;
                }
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    (out, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::executor::OutputVolume;

    fn job(command: &[&str]) -> TrialJobSpec {
        TrialJobSpec {
            executor: ExecutorSpec::Local,
            command: command.iter().map(|s| s.to_string()).collect(),
            args: Vec::new(),
            arg_style: ArgStyle::Equals,
            boolean_flags: false,
            workdir: None,
            env: BTreeMap::new(),
            timeout_secs: None,
            max_retries: 0,
            output_dir: None,
            output_layout: OutputLayout::Study,
            metric_regex: None,
            resources: None,
            worker_pools: Vec::new(),
        }
    }

    fn params() -> Assignment {
        [
            ("lr".to_string(), Value::Float(0.01)),
            ("layers".to_string(), Value::Int(3)),
            ("opt".to_string(), Value::Str("adam w".to_string())),
            ("fp16".to_string(), Value::Str("true".to_string())),
            ("ema".to_string(), Value::Str("false".to_string())),
        ]
        .into()
    }

    #[test]
    fn default_appends_equals_args_in_id_order_without_a_shell() {
        let argv = job(&["python3", "train.py"]).render_argv(&params(), TrialId::new(7), "/p.json");
        assert_eq!(
            argv,
            [
                "python3",
                "train.py",
                "--ema=false",
                "--fp16=true",
                "--layers=3",
                "--lr=0.01",
                "--opt=adam w"
            ]
        );
    }

    #[test]
    fn styles_and_boolean_flags() {
        let mut j = job(&["t"]);
        j.arg_style = ArgStyle::Space;
        j.boolean_flags = true;
        assert_eq!(
            j.render_argv(&params(), TrialId::new(1), ""),
            [
                "t", "--fp16", "--layers", "3", "--lr", "0.01", "--opt", "adam w"
            ]
        );
        j.arg_style = ArgStyle::KeyValue;
        j.boolean_flags = false;
        assert_eq!(
            j.render_argv(&params(), TrialId::new(1), "")[1],
            "ema=false"
        );
        j.arg_style = ArgStyle::Hydra;
        assert_eq!(
            j.render_argv(&params(), TrialId::new(1), "")[3],
            "++layers=3"
        );
    }

    #[test]
    fn placeholders_place_values_and_args() {
        let j = job(&["run", "--learning-rate", "${lr}", "--name=t${trial_id}"]);
        assert_eq!(
            j.render_argv(&params(), TrialId::new(12), ""),
            ["run", "--learning-rate", "0.01", "--name=t12"]
        );
        let j = job(&["run", "${args}", "--", "x"]);
        assert_eq!(
            j.render_argv(&params(), TrialId::new(1), "")[1],
            "--ema=false"
        );
        assert_eq!(
            j.render_argv(&params(), TrialId::new(1), "")
                .last()
                .map(String::as_str),
            Some("x")
        );
        let j = job(&["run", "--config", "${params_file}"]);
        assert_eq!(
            j.render_argv(&params(), TrialId::new(1), "/runs/1/params.json"),
            ["run", "--config", "/runs/1/params.json"]
        );
    }

    /// `args` (Vertex's `containerSpec.args`) come after the command and before the values,
    /// with placeholders filled in; a pool without its own takes the job's, and one with
    /// `args: []` has none. A job without `args` renders exactly as before.
    #[test]
    fn args_follow_the_command_and_precede_the_values() {
        let mut j = job(&["python3", "train.py"]);
        let without = j.render_argv(&params(), TrialId::new(7), "");
        j.args = vec!["--epochs=5".into(), "--run=t${trial_id}".into()];
        let with = j.render_argv(&params(), TrialId::new(7), "");
        assert_eq!(with[..4], ["python3", "train.py", "--epochs=5", "--run=t7"]);
        assert_eq!(with[4..], without[2..]);
        j.args = vec!["--lr".into(), "${lr}".into()];
        assert_eq!(
            j.render_argv(&params(), TrialId::new(7), ""),
            ["python3", "train.py", "--lr", "0.01"],
            "a placeholder in args places the values as in the command"
        );
        j.args = vec!["--epochs=5".into()];
        let mut own = pool(1);
        if let Some(p) = own.as_mut() {
            p.args = Some(Vec::new());
        }
        j.worker_pools = vec![pool(1), own];
        let replicas = j.replicas();
        assert_eq!(replicas[0].args, ["--epochs=5".to_string()]);
        assert!(replicas[1].args.is_empty());
    }

    #[test]
    fn machine_and_accelerator_types_must_look_like_vertexs() {
        let with = |machine: &str, accelerator: &str| {
            let mut j = job(&["train"]);
            let mut primary = pool(1);
            if let Some(p) = primary.as_mut() {
                p.machine_type = Some(machine.into());
                p.accelerator_type = Some(accelerator.into());
            }
            j.worker_pools = vec![primary];
            j.validate().map_err(|e| e.field)
        };
        assert_eq!(with("n1-standard-4", "NVIDIA_TESLA_T4"), Ok(()));
        assert_eq!(with("a2-highgpu-1g", "TPU_V5_LITEPOD"), Ok(()));
        let machine = Err("trial_job.worker_pools[0].machine_type".to_string());
        for bad in [
            "",
            "n1",
            "N1-standard-4",
            "n1--standard",
            "-n1-x",
            "n1-x\n",
            &"n1-x".repeat(20),
        ] {
            assert_eq!(with(bad, "NVIDIA_TESLA_T4"), machine, "{bad:?}");
        }
        let accelerator = Err("trial_job.worker_pools[0].accelerator_type".to_string());
        for bad in ["", "nvidia-t4", "_T4", "NVIDIA T4", &"T".repeat(65)] {
            assert_eq!(with("n1-standard-4", bad), accelerator, "{bad:?}");
        }
    }

    #[test]
    fn validation_names_fields() {
        let mut j = job(&[]);
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.command".to_string())
        );
        j = job(&["x"]);
        j.env.insert("AIP_MODEL_DIR".into(), "x".into());
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.env.AIP_MODEL_DIR".to_string())
        );
        j = job(&["x"]);
        j.metric_regex = Some("(?P<name>\\w+)".into());
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.metric_regex".to_string())
        );
        j = job(&["x"]);
        j.executor = ExecutorSpec::Slurm(SlurmOptions {
            partition: None,
            sbatch_args: vec!["--mem=1G".into(), "--export=ALL".into()],
            nodes: None,
        });
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.slurm.sbatch_args[1]".to_string())
        );
    }

    fn pool(replicas: u32) -> Option<WorkerPoolSpec> {
        Some(WorkerPoolSpec {
            replicas,
            ..Default::default()
        })
    }

    #[test]
    fn worker_pools_name_the_field_that_breaks_the_cluster() {
        let with = |pools: Vec<Option<WorkerPoolSpec>>| {
            let mut j = job(&["train"]);
            j.worker_pools = pools;
            j.validate().map_err(|e| e.field)
        };
        assert_eq!(with(vec![pool(1), pool(2), None, pool(1)]), Ok(()));
        assert_eq!(
            with(vec![pool(2)]),
            Err("trial_job.worker_pools[0].replicas".into())
        );
        assert_eq!(
            with(vec![None, pool(1)]),
            Err("trial_job.worker_pools[0]".into())
        );
        assert_eq!(
            with(vec![pool(1), pool(0)]),
            Err("trial_job.worker_pools[1].replicas".into())
        );
        assert_eq!(
            with(vec![pool(1), pool(1), pool(1), pool(1), pool(1)]),
            Err("trial_job.worker_pools".into())
        );
        assert_eq!(
            with(vec![pool(1), None]),
            Err("trial_job.worker_pools[1]".into())
        );
        let mut tf = pool(1);
        if let Some(p) = tf.as_mut() {
            p.env.insert("TF_CONFIG".into(), "{}".into());
        }
        assert_eq!(
            with(vec![pool(1), tf]),
            Err("trial_job.worker_pools[1].env.TF_CONFIG".into())
        );
        let mut big = pool(1);
        if let Some(p) = big.as_mut() {
            p.resources = Some(Resources {
                memory: Some("lots".into()),
                ..Default::default()
            });
        }
        assert_eq!(
            with(vec![big]),
            Err("trial_job.worker_pools[0].resources.memory".into())
        );
    }

    #[test]
    fn replicas_come_primary_first_with_their_pools_command_and_resources() {
        let mut j = job(&["train"]);
        j.resources = Some(Resources {
            gpu: Some(1),
            ..Default::default()
        });
        let mut ps = pool(1);
        if let Some(p) = ps.as_mut() {
            p.command = Some(vec!["ps".into()]);
            p.resources = Some(Resources::default());
        }
        j.worker_pools = vec![pool(1), pool(2), ps];
        let replicas = j.replicas();
        let names: Vec<String> = replicas.iter().map(|r| r.id.name()).collect();
        assert_eq!(
            names,
            [
                "workerpool0-0",
                "workerpool1-0",
                "workerpool1-1",
                "workerpool2-0"
            ]
        );
        assert_eq!(replicas[3].command, ["ps".to_string()]);
        assert_eq!(replicas[1].resources.and_then(|r| r.gpu), Some(1));
        assert_eq!(replicas[3].resources.and_then(|r| r.gpu), None);
        assert_eq!(ReplicaId::parse("workerpool1-1"), Some(replicas[2].id));
        assert_eq!(ReplicaId::parse("workerpool-1"), None);
        assert_eq!(parse_memory("16Gi"), Some(16 << 30));
        assert_eq!(parse_memory("8G"), Some(8_000_000_000));
        assert_eq!(parse_memory("1.5Gi"), None);
    }

    #[test]
    fn kubernetes_output_volumes_need_an_absolute_mount_or_an_object_store_uri() {
        let mut j = job(&["train"]);
        let with = |j: &mut TrialJobSpec, volume: OutputVolume| {
            j.executor = ExecutorSpec::Kubernetes {
                image: Some("trainer:1".into()),
                options: KubernetesOptions {
                    output_volume: Some(volume),
                    ..Default::default()
                },
            };
            j.validate().map_err(|e| e.field)
        };
        let claim = |mount: &str| OutputVolume::PersistentVolumeClaim {
            claim_name: "runs".into(),
            mount_path: mount.into(),
        };
        assert_eq!(with(&mut j, claim("/mnt/runs")), Ok(()));
        assert_eq!(
            with(&mut j, claim("runs")),
            Err("trial_job.kubernetes.output_volume.persistent_volume_claim.mount_path".into())
        );
        assert_eq!(
            with(&mut j, OutputVolume::ObjectStore),
            Err("trial_job.output_dir".into())
        );
        j.output_dir = Some("gs://bucket/runs".into());
        assert_eq!(with(&mut j, OutputVolume::ObjectStore), Ok(()));
        j.command = vec!["train".into(), "--config=${params_file}".into()];
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.command".into())
        );
        j.command = vec!["train".into()];
        j.args = vec!["--config=${params_file}".into()];
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.args".into())
        );
    }

    #[test]
    fn executors_that_run_images_need_one_and_others_refuse_it() {
        let mut j = job(&["python3", "train.py"]);
        let kubernetes = |image: Option<&str>| ExecutorSpec::Kubernetes {
            image: image.map(str::to_string),
            options: KubernetesOptions::default(),
        };
        j.executor = kubernetes(None);
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.image".to_string())
        );
        j.executor = kubernetes(Some("registry.example/trainer:1"));
        assert_eq!(j.validate().map_err(|e| e.field), Ok(()));
        j.executor = kubernetes(Some("bad image"));
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.image".to_string())
        );
        // A pool's own image, where the executor runs none.
        let mut local = job(&["train"]);
        local.worker_pools = vec![pool(1)];
        if let Some(Some(primary)) = local.worker_pools.first_mut() {
            primary.image = Some("trainer:1".into());
        }
        assert_eq!(
            local.validate().map_err(|e| e.field),
            Err("trial_job.worker_pools[0].image".to_string())
        );
    }

    /// An executor's options given to another cannot be read: the spec is refused as it
    /// is parsed, naming the option.
    #[test]
    fn options_of_another_executor_are_refused_when_read() {
        for (extra, option) in [
            (serde_json::json!({"image": "trainer:1"}), "`image`"),
            (serde_json::json!({"kubernetes": {}}), "`kubernetes`"),
            (
                serde_json::json!({"slurm": {"partition": "gpu"}}),
                "`slurm`",
            ),
        ] {
            let mut job = serde_json::json!({"executor": "local", "command": ["train"]});
            if let (Some(job), Some(extra)) = (job.as_object_mut(), extra.as_object()) {
                job.extend(extra.clone());
            }
            let error = serde_json::from_value::<TrialJobSpec>(job)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert!(
                error.as_ref().is_err_and(|e| e.contains(option)),
                "{option}: {error:?}"
            );
        }
    }

    /// What is read is written back as it was: stored specs keep their text, and options
    /// left at their defaults stay absent.
    #[test]
    fn a_trial_job_is_written_as_it_was_read() {
        for text in [
            serde_json::json!({"executor": "local", "command": ["train"]}),
            serde_json::json!({"executor": "slurm", "command": ["train"],
                               "slurm": {"partition": "gpu", "nodes": 3}}),
            serde_json::json!({"executor": "slurm", "command": ["train"]}),
            serde_json::json!({"executor": "container", "command": [], "image": "t:1"}),
            serde_json::json!({"executor": "kubernetes", "command": [], "image": "t:1",
                               "kubernetes": {"namespace": "ml"}}),
        ] {
            let job: TrialJobSpec = serde_json::from_value(text.clone()).expect("a valid job");
            let mut written = serde_json::to_value(&job).expect("serialisable");
            for key in ["executor", "slurm", "kubernetes", "image"] {
                assert_eq!(written.get(key), text.get(key), "{key} of {text}");
            }
            // The rest: as read, besides the defaults every job is written with.
            if let Some(w) = written.as_object_mut() {
                w.retain(|k, _| text.get(k).is_some());
            }
            assert_eq!(written, text);
        }
    }
}
