//! `trial_job`'s executor: where a trial's replicas run, with that executor's own options
//! and their validation. [`ExecutorSpec`] has one variant per executor, so options of one
//! cannot be given to another; on the wire (and in stored specs) it is `trial_job`'s flat
//! `executor`, `slurm`, `kubernetes` and `image` ([`ExecutorFields`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;

/// Where and how a trial's replicas run. A new executor is a variant here (with its
/// options), its name in [`ExecutorName`] and its arm in `dispatch::executor_for`.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ExecutorSpec {
    /// Child processes of the service, each in its own process group.
    #[default]
    Local,
    /// A Slurm batch job per attempt.
    Slurm(SlurmOptions),
    /// A local container per replica (Podman or Docker); `image` for every replica that
    /// names none of its own.
    Container { image: Option<String> },
    /// An Indexed Job per worker pool and a headless Service per attempt.
    Kubernetes {
        image: Option<String>,
        options: KubernetesOptions,
    },
    /// Run by the workers of a named pool (`augur worker --pool NAME`), never by the
    /// server's own dispatcher: each worker runs the study's command (or `image`, in a
    /// container) under its own allow-lists.
    Pool(PoolOptions),
}

/// Options of the pool executor: which pool runs the study's trials, the study's share of
/// it, and optionally an image each replica runs in (a container on the worker's machine).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolOptions {
    /// The pool's name (`trial_job.pool`): what `augur worker --pool` names.
    pub name: String,
    /// The study's weight in the pool's fair share (`trial_job.pool_weight`, default 1): a
    /// free slot goes to the study with the fewest running trials per unit of weight.
    pub weight: Option<f64>,
    /// An image every replica runs in, on the worker (checked against its `--job-images`).
    pub image: Option<String>,
}

/// Longest pool name.
pub const MAX_POOL_NAME_LEN: usize = 64;

/// A pool's name: 1-64 letters, digits, `-`, `_` or `.`, starting with a letter or digit
/// (it is a path segment: `/v1/pools/{pool}`).
pub fn check_pool_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_POOL_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "must name a pool: 1-{MAX_POOL_NAME_LEN} letters, digits, '-', '_' or '.', \
             starting with a letter or digit"
        ))
    }
}

impl PoolOptions {
    /// The weight in the fair share (1 unless given).
    pub fn weight(&self) -> f64 {
        self.weight.unwrap_or(1.0)
    }
}

impl ExecutorSpec {
    pub fn name(&self) -> ExecutorName {
        match self {
            ExecutorSpec::Local => ExecutorName::Local,
            ExecutorSpec::Slurm(_) => ExecutorName::Slurm,
            ExecutorSpec::Container { .. } => ExecutorName::Container,
            ExecutorSpec::Kubernetes { .. } => ExecutorName::Kubernetes,
            ExecutorSpec::Pool(_) => ExecutorName::Pool,
        }
    }

    /// Whether replicas run from a container image (one required for each): a pool's
    /// when it names one.
    pub fn runs_images(&self) -> bool {
        match self {
            ExecutorSpec::Pool(options) => options.image.is_some(),
            _ => self.name().runs_images(),
        }
    }

    /// The pool's options, when the study's trials are run by a pool's workers.
    pub fn pool(&self) -> Option<&PoolOptions> {
        match self {
            ExecutorSpec::Pool(options) => Some(options),
            _ => None,
        }
    }

    /// The image of every replica that names none of its own.
    pub fn image(&self) -> Option<&str> {
        match self {
            ExecutorSpec::Container { image }
            | ExecutorSpec::Kubernetes { image, .. }
            | ExecutorSpec::Pool(PoolOptions { image, .. }) => image.as_deref(),
            ExecutorSpec::Local | ExecutorSpec::Slurm(_) => None,
        }
    }

    /// The Kubernetes executor's options, when it is that one.
    pub fn kubernetes(&self) -> Option<&KubernetesOptions> {
        match self {
            ExecutorSpec::Kubernetes { options, .. } => Some(options),
            _ => None,
        }
    }

    /// The options' own rules (`output_dir` is the job's: an object store needs a URI).
    pub fn validate(&self, output_dir: Option<&str>) -> Result<(), ValidationError> {
        match self {
            ExecutorSpec::Local | ExecutorSpec::Container { .. } => Ok(()),
            ExecutorSpec::Slurm(options) => {
                for (i, arg) in options.sbatch_args.iter().enumerate() {
                    check_sbatch_arg(arg).map_err(|why| {
                        ValidationError::new(format!("trial_job.slurm.sbatch_args[{i}]"), why)
                    })?;
                }
                Ok(())
            }
            ExecutorSpec::Kubernetes { options, .. } => {
                if let Some(volume) = &options.output_volume {
                    validate_output_volume(volume, output_dir)?;
                }
                validate_pod_metadata(options)
            }
            ExecutorSpec::Pool(options) => {
                if options.name.is_empty() {
                    return Err(ValidationError::new(
                        "trial_job.pool",
                        "executor: pool needs the pool's name (what `augur worker --pool` names)",
                    ));
                }
                check_pool_name(&options.name)
                    .map_err(|why| ValidationError::new("trial_job.pool", why))?;
                if options
                    .weight
                    .is_some_and(|w| !(w.is_finite() && w > 0.0 && w <= 1000.0))
                {
                    return Err(ValidationError::new(
                        "trial_job.pool_weight",
                        "must be a number above 0 (at most 1000)",
                    ));
                }
                Ok(())
            }
        }
    }
}

/// `trial_job`'s executor fields as written: what [`ExecutorSpec`] is read from and written
/// as (absent options are the executor's defaults).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecutorFields {
    pub executor: ExecutorName,
    pub slurm: Option<SlurmOptions>,
    pub kubernetes: Option<KubernetesOptions>,
    pub image: Option<String>,
    pub pool: Option<String>,
    pub pool_weight: Option<f64>,
}

impl TryFrom<ExecutorFields> for ExecutorSpec {
    /// The message names the field (the error is reported at `trial_job`).
    type Error = String;

    fn try_from(fields: ExecutorFields) -> Result<Self, String> {
        let ExecutorFields {
            executor,
            slurm,
            kubernetes,
            image,
            pool,
            pool_weight,
        } = fields;
        if (pool.is_some() || pool_weight.is_some()) && executor != ExecutorName::Pool {
            return Err("`pool` and `pool_weight` apply to executor: pool only".into());
        }
        if slurm.is_some() && executor != ExecutorName::Slurm {
            return Err("`slurm` applies to executor: slurm only".into());
        }
        if kubernetes.is_some() && executor != ExecutorName::Kubernetes {
            return Err("`kubernetes` applies to executor: kubernetes only".into());
        }
        if image.is_some() && !executor.runs_images() && executor != ExecutorName::Pool {
            return Err(
                "`image` applies to executors that run images: container, kubernetes, pool".into(),
            );
        }
        Ok(match executor {
            ExecutorName::Local => ExecutorSpec::Local,
            ExecutorName::Slurm => ExecutorSpec::Slurm(slurm.unwrap_or_default()),
            ExecutorName::Container => ExecutorSpec::Container { image },
            ExecutorName::Kubernetes => ExecutorSpec::Kubernetes {
                image,
                options: kubernetes.unwrap_or_default(),
            },
            // A missing name is refused by `validate`, naming `trial_job.pool`.
            ExecutorName::Pool => ExecutorSpec::Pool(PoolOptions {
                name: pool.unwrap_or_default(),
                weight: pool_weight,
                image,
            }),
        })
    }
}

impl From<ExecutorSpec> for ExecutorFields {
    fn from(spec: ExecutorSpec) -> Self {
        let executor = spec.name();
        let (mut pool, mut pool_weight) = (None, None);
        let (slurm, kubernetes, image) = match spec {
            ExecutorSpec::Local => (None, None, None),
            ExecutorSpec::Pool(options) => {
                pool = Some(options.name);
                pool_weight = options.weight;
                (None, None, options.image)
            }
            ExecutorSpec::Slurm(options) => (
                Some(options).filter(|o| *o != SlurmOptions::default()),
                None,
                None,
            ),
            ExecutorSpec::Container { image } => (None, None, image),
            ExecutorSpec::Kubernetes { image, options } => (
                None,
                Some(options).filter(|o| *o != KubernetesOptions::default()),
                image,
            ),
        };
        ExecutorFields {
            executor,
            slurm,
            kubernetes,
            image,
            pool,
            pool_weight,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorName {
    /// A child process of the service, in its own process group.
    #[default]
    Local,
    /// A Slurm batch job (`sbatch`), watched with `squeue`/`scontrol`.
    Slurm,
    /// Kubernetes: an Indexed Job per worker pool and a headless Service per attempt.
    Kubernetes,
    /// A local container per replica (Podman or Docker) of the job's `image`.
    Container,
    /// The workers of a named pool (`augur worker --pool`), shared by many studies.
    Pool,
}

impl ExecutorName {
    /// Whether replicas run from a container image (`image` required).
    pub fn runs_images(self) -> bool {
        matches!(self, ExecutorName::Kubernetes | ExecutorName::Container)
    }
}

/// Options for the Slurm executor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `--partition`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Further `sbatch` options, e.g. `["--gres=gpu:1", "--mem=8G"]`: `--name=value` of
    /// those that say where and with what a job runs (partition, time, gres, gpus, mem,
    /// cpus-per-task, constraint, account, qos, reservation, nodelist, exclude, exclusive,
    /// …). Files, users, the environment and the task layout are Augur's and the operator's
    /// (`augur serve --slurm-arg`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch_args: Vec<String>,
    /// `--nodes` for a cluster's allocation (by default Slurm places its tasks as it likes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
}

/// A Kubernetes toleration (`spec.tolerations[]` of a pod).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Equal` or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// Where a Kubernetes trial's `AIP_*` directories live.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum OutputVolume {
    /// A PersistentVolumeClaim (one of the server's `--kubernetes-claims`, unless an admin's)
    /// mounted in every pod at `mount_path`; the trial directories are
    /// `<mount_path>/<output_dir>/study-<id>-<created>/<trial>/…`.
    PersistentVolumeClaim {
        claim_name: String,
        mount_path: String,
    },
    /// Nothing is mounted: `output_dir` is an object-store URI (`gs://…`, `s3://…`) passed
    /// through in `AIP_*` for the trainer to write to itself.
    ObjectStore,
}

/// Options of the Kubernetes executor (DESIGN §4.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KubernetesOptions {
    /// Namespace of the trial's Jobs and Service (default: the server's
    /// `--kubernetes-namespace`); one of the server's `--kubernetes-namespaces`, unless an
    /// admin's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The pods' service account: one of the server's `--kubernetes-service-accounts`,
    /// unless an admin's; never the server's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Extra labels and annotations of the pods (e.g. `sidecar.istio.io/inject: "false"`);
    /// keys under `kubernetes.io`, `k8s.io` and `augur.dev` are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_volume: Option<OutputVolume>,
    /// How long a pod may wait for its image before the attempt fails (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_timeout_secs: Option<u64>,
}

/// `sbatch` options a spec may pass: where and with what a job runs. Everything else is
/// the server's: options that name files slurmd (root) opens (`--output`, `--error`,
/// `--input`, `--chdir`), whose user the job runs as (`--uid`, `--gid`, `--get-user-env`),
/// its environment (`--export`), or the layout Augur writes (`--ntasks`, `--nodes`, …).
/// An operator adds options of its own to every job with `augur serve --slurm-arg`.
const SBATCH_OPTIONS: [&str; 44] = [
    "partition",
    "time",
    "time-min",
    "gres",
    "gres-flags",
    "gpus",
    "gpus-per-node",
    "gpus-per-task",
    "gpus-per-socket",
    "cpus-per-gpu",
    "mem",
    "mem-per-cpu",
    "mem-per-gpu",
    "cpus-per-task",
    "mincpus",
    "tmp",
    "constraint",
    "cluster-constraint",
    "account",
    "qos",
    "reservation",
    "nodelist",
    "exclude",
    "exclusive",
    "oversubscribe",
    "overcommit",
    "contiguous",
    "distribution",
    "spread-job",
    "ntasks-per-node",
    "switches",
    "licenses",
    "hint",
    "sockets-per-node",
    "cores-per-socket",
    "threads-per-core",
    "comment",
    "nice",
    "requeue",
    "no-requeue",
    "signal",
    "begin",
    "deadline",
    "wckey",
];

/// Whether a spec may pass `arg` to `sbatch`: `--option=value` (or a flag) of
/// [`SBATCH_OPTIONS`], spelled out in full.
fn check_sbatch_arg(arg: &str) -> Result<(), String> {
    let Some(option) = arg.strip_prefix("--") else {
        return Err(format!(
            "{arg:?}: give sbatch options as --name=value, in full (short options and \
             separate values are not accepted)"
        ));
    };
    let name = option.split_once('=').map_or(option, |(name, _)| name);
    if arg.chars().any(char::is_control) {
        return Err(format!("{arg:?}: control characters"));
    }
    if SBATCH_OPTIONS.contains(&name) {
        return Ok(());
    }
    Err(format!(
        "--{name} is not an option a study may pass to sbatch (files, users, environment and \
         the task layout are Augur's and the operator's: augur serve --slurm-arg); allowed: {}",
        SBATCH_OPTIONS.join(", ")
    ))
}

/// Label and annotation keys in these domains (`app.kubernetes.io/name`, `augur.dev/trial`)
/// are Kubernetes', the deployment's and Augur's own: with them a trial's pod could pass for
/// the server (be an endpoint of its Service, pass its NetworkPolicy) or for another trial.
fn is_reserved_key(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else {
        return false;
    };
    let domain = domain.to_ascii_lowercase();
    ["kubernetes.io", "k8s.io", "augur.dev"]
        .iter()
        .any(|reserved| domain == *reserved || domain.ends_with(&format!(".{reserved}")))
}

/// Refuse pod labels and annotations in reserved domains ([`is_reserved_key`]).
fn validate_pod_metadata(options: &KubernetesOptions) -> Result<(), ValidationError> {
    for (kind, map) in [
        ("labels", &options.labels),
        ("annotations", &options.annotations),
    ] {
        if let Some(key) = map.keys().find(|k| is_reserved_key(k)) {
            return Err(ValidationError::new(
                format!("trial_job.kubernetes.{kind}.{key}"),
                "keys under kubernetes.io, k8s.io and augur.dev are Kubernetes', the \
                 deployment's and Augur's own (a trial's pod could pass for the server)",
            ));
        }
    }
    Ok(())
}

/// A claim mounted at an absolute path; an object store only with a URI to write to.
fn validate_output_volume(
    volume: &OutputVolume,
    output_dir: Option<&str>,
) -> Result<(), ValidationError> {
    let field = "trial_job.kubernetes.output_volume";
    match volume {
        OutputVolume::PersistentVolumeClaim {
            claim_name,
            mount_path,
        } => {
            if claim_name.trim().is_empty() {
                return Err(ValidationError::new(
                    format!("{field}.persistent_volume_claim.claim_name"),
                    "must name a PersistentVolumeClaim",
                ));
            }
            if !mount_path.starts_with('/') || mount_path.contains(':') {
                return Err(ValidationError::new(
                    format!("{field}.persistent_volume_claim.mount_path"),
                    "must be an absolute path",
                ));
            }
        }
        OutputVolume::ObjectStore => {
            if !output_dir.is_some_and(|d| d.contains("://")) {
                return Err(ValidationError::new(
                    "trial_job.output_dir",
                    "with output_volume: object_store, must be a URI (gs://…, s3://…) \
                     the trainer writes to",
                ));
            }
        }
    }
    Ok(())
}
