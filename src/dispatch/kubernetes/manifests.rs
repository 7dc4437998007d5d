//! What the Kubernetes executor asks the API server for, per trial attempt (DESIGN §4.2): one
//! Indexed `batch/v1` Job per worker pool, one headless Service that gives every replica a
//! stable name (`<job>-<index>.<service>`), and one Secret holding the attempt's trial token
//! and the server variables passed on by name (`--job-env`, which may be keys).
//! Pure: the same request always gives the same objects (the golden test pins them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, LocalObjectReference,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSchedulingGate, PodSpec,
    PodTemplateSpec, ResourceRequirements, Secret, SecretKeySelector, Service, ServicePort,
    ServiceSpec, Toleration as KubeToleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::super::cluster::Address;
use super::super::executor::{ExecutorError, JobRequest, ReplicaRequest};
use crate::model::executor::{KubernetesOptions, OutputVolume, Toleration};
use crate::model::job::CLUSTER_ENV;
use crate::model::job::is_inherited_env;
use crate::model::{
    OutputLayout, ReplicaId, Resources, StudyDir, StudyId, StudyKey, TrialDirs, TrialId,
    TrialJobSpec,
};

/// Every replica listens on this port (each pod has its own address, so one port serves all).
pub const CLUSTER_PORT: u16 = 2222;
/// The trainer's container in every pod.
pub const CONTAINER: &str = "trainer";
/// The scheduling gate of a pool whose replicas' variables differ (see the module header).
pub const ENV_GATE: &str = "augur.dev/replica-env";
/// Prefix of the annotations that carry a replica's own variables.
pub const ENV_ANNOTATION_PREFIX: &str = "env.augur.dev/";
/// The Secret's key (and the variable) of the trial token.
pub const TOKEN_KEY: &str = "AUGUR_TRIAL_TOKEN";
/// The annotation (and label) the Job controller gives each pod of an Indexed Job.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// The label the Job controller gives a Job's pods: the Job's name.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "augur";
pub const LABEL_STUDY: &str = "augur.dev/study";
pub const LABEL_TRIAL: &str = "augur.dev/trial";
pub const LABEL_ATTEMPT: &str = "augur.dev/attempt";
pub const LABEL_POOL: &str = "augur.dev/replica-pool";

/// A finished Job is removed by Kubernetes after this long if Augur did not delete it (it
/// does, as soon as the attempt is decided; this covers a service that died meanwhile).
const TTL_AFTER_FINISHED_SECS: i32 = 600;
/// SIGTERM to SIGKILL for a deleted pod: the local executor's stop grace.
const TERMINATION_GRACE_SECS: i64 = 5;
const OUTPUT_VOLUME: &str = "augur-output";
/// The primary's init container that makes PBT's copy of another trial's checkpoint.
pub const CHECKPOINT_COPY: &str = "augur-copy-checkpoint";
/// What it runs (`sh -c`, `$1` the parent's checkpoint directory, `$2` the trial's): the
/// trial's directory replaced by a copy, links copied as links (`cp -a`), as the other
/// executors' dispatcher copies (`dispatch/checkpoint.rs`). Safe to repeat: each attempt
/// copies afresh.
const CHECKPOINT_COPY_SCRIPT: &str = r#"set -eu; [ -d "$1" ] || { echo "augur: no checkpoint directory $1" >&2; exit 1; }; rm -rf "$2"; mkdir -p "$(dirname "$2")"; cp -a "$1" "$2""#;
/// Where the trial directories are in a pod without an `output_volume`: a scratch
/// `emptyDir`, gone with the pod (checkpoints do not survive a retry then).
pub const SCRATCH_OUTPUT_DIR: &str = "/augur/output";

/// The names of one attempt's objects: `augur-s<study>-t<trial>-a<attempt>` for the Service
/// and the Secret, `…-wp<pool>` for each pool's Job. At most 62 characters for any `i64`
/// study and trial and `u32` attempt, so every name is a valid DNS-1123 label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptNames {
    pub base: String,
}

impl AttemptNames {
    pub fn new(study_id: StudyId, trial_id: TrialId, attempt: u32) -> Self {
        // Ids are positive; `unsigned_abs` keeps a name valid whatever they are.
        Self {
            base: format!(
                "augur-s{}-t{}-a{attempt}",
                study_id.get().unsigned_abs(),
                trial_id.get().unsigned_abs()
            ),
        }
    }

    pub fn service(&self) -> &str {
        &self.base
    }

    pub fn secret(&self) -> &str {
        &self.base
    }

    pub fn job(&self, pool: usize) -> String {
        Self::job_of(&self.base, pool)
    }

    /// The Job of `pool` in the attempt whose objects are named `attempt` (a job handle's).
    pub fn job_of(attempt: &str, pool: usize) -> String {
        format!("{attempt}-wp{pool}")
    }

    /// A replica's stable address: the pod's hostname (`<job>-<index>`, set by the Job
    /// controller) under the Service's subdomain.
    pub fn replica_host(&self, id: ReplicaId) -> String {
        format!("{}-{}.{}", self.job(id.pool), id.index, self.service())
    }
}

/// The labels every object of an attempt carries (the pool's is added on Jobs and pods).
pub fn attempt_labels(
    study_id: StudyId,
    trial_id: TrialId,
    attempt: u32,
) -> BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY, MANAGED_BY.to_string()),
        (LABEL_STUDY, study_id.to_string()),
        (LABEL_TRIAL, trial_id.to_string()),
        (LABEL_ATTEMPT, attempt.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The label selector of a trial's objects (every attempt's), e.g. for a restarted service.
pub fn trial_selector(study_id: StudyId, trial_id: TrialId) -> String {
    format!("{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_STUDY}={study_id},{LABEL_TRIAL}={trial_id}")
}

/// The label selector of one attempt's objects.
pub fn attempt_selector(study_id: StudyId, trial_id: TrialId, attempt: u32) -> String {
    format!(
        "{},{LABEL_ATTEMPT}={attempt}",
        trial_selector(study_id, trial_id)
    )
}

/// Everything one attempt creates.
///
/// **Per-replica environment in an Indexed Job.** Every pod of an Indexed Job is made from
/// one template, so the pods of a pool cannot be given different `env` values, yet
/// `CLUSTER_SPEC`, `TF_CONFIG`, `AUGUR_REPLICA`, `RANK` and a worker's metric file differ
/// per replica, and `RANK` is not even a function of the completion index that Kubernetes'
/// `$(VAR)` expansion could spell (a worker's rank is its index + 1). So: a variable whose
/// value is the same for every replica of the pool is a plain `value`; one that differs is
/// read through the downward API from the pod's own annotation `env.augur.dev/<NAME>`
/// (`valueFrom.fieldRef`), and the pool's pods are created behind a scheduling gate
/// (`augur.dev/replica-env`). The executor, watching the attempt's pods, writes each pod's
/// annotations from [`AttemptManifests::per_index`] (exactly what `cluster_env` says that
/// replica is told) and removes the gate in one patch; only then is the pod scheduled, and
/// the kubelet resolves the variables when it starts the container. Kueue ungates pods the
/// same way after writing per-pod placement. Pools of one replica (the primary always) need
/// no gate. No init container, no shell in the image, no wrapper binary: any image runs
/// unchanged, and every replica sees exactly the variables the local executor would give it
/// (PBT's checkpoint copy, [`CHECKPOINT_COPY`], is the one init container, and only when a
/// segment copies).
#[derive(Debug, Clone)]
pub struct AttemptManifests {
    pub names: AttemptNames,
    /// The trial token and the passed-on variables, when the attempt has any.
    pub secret: Option<Secret>,
    pub service: Service,
    /// One per pool that has replicas, the primary's first: `(pool, Job)`.
    pub jobs: Vec<(usize, Job)>,
    /// For each gated pool, each index's annotations (its own variables), written on its pod
    /// before the gate is lifted.
    pub per_index: BTreeMap<usize, Vec<BTreeMap<String, String>>>,
}

impl AttemptManifests {
    /// The annotations replica `id` must get before it may start (`None`: its pool is not
    /// gated, or no such replica).
    pub fn annotations_for(&self, id: ReplicaId) -> Option<&BTreeMap<String, String>> {
        self.per_index.get(&id.pool)?.get(id.index)
    }
}

/// The attempt's objects in `namespace`, for `request` of a trial of `job`.
pub fn attempt_manifests(
    request: &JobRequest,
    job: &TrialJobSpec,
    namespace: &str,
) -> Result<AttemptManifests, ExecutorError> {
    let names = AttemptNames::new(request.study_id, request.trial_id, request.attempt);
    let secret_data = secret_data(request, job);
    let attempt = Attempt {
        names: &names,
        namespace,
        labels: attempt_labels(request.study_id, request.trial_id, request.attempt),
        options: job.executor.kubernetes().cloned().unwrap_or_default(),
        output: PodOutput::of(job),
        secret_keys: secret_data.keys().cloned().collect(),
    };
    let secret = (!secret_data.is_empty()).then(|| Secret {
        metadata: attempt.meta(names.secret(), attempt.labels.clone()),
        type_: Some("Opaque".to_string()),
        string_data: Some(secret_data),
        ..Default::default()
    });
    let service = attempt.headless_service();
    let mut pools: BTreeMap<usize, Vec<&ReplicaRequest>> = BTreeMap::new();
    for replica in &request.replicas {
        pools.entry(replica.id.pool).or_default().push(replica);
    }
    let mut jobs = Vec::new();
    let mut per_index = BTreeMap::new();
    for (pool, replicas) in pools {
        let Some(first) = replicas.first() else {
            continue;
        };
        let job_name = names.job(pool);
        // The longest hostname, `<job>-<last index>`, must be a DNS label too.
        if job_name.len() + 1 + (replicas.len() - 1).to_string().len() > 63 {
            return Err(ExecutorError::Launch(format!(
                "the Job name {job_name} leaves no room for its pods' hostnames"
            )));
        }
        let (env, own) = attempt.pool_env(request, job, pool, &replicas);
        let gated = !own.is_empty();
        if gated {
            per_index.insert(pool, own);
        }
        let container = attempt.container(request, job, pool, first, env)?;
        let copy = (pool == 0)
            .then_some(request.copy_checkpoint_from)
            .flatten()
            .map(|parent| attempt.checkpoint_copy(request, parent, &container));
        let mut pod = attempt.pod_spec(container, gated);
        pod.init_containers = copy.map(|c| vec![c]);
        jobs.push((pool, attempt.indexed_job(job, pool, replicas.len(), pod)?));
    }
    Ok(AttemptManifests {
        names,
        secret,
        service,
        jobs,
        per_index,
    })
}

/// What the token and the variables the server passes on by name are: they go in the
/// attempt's Secret, not in its Jobs.
fn secret_data(request: &JobRequest, job: &TrialJobSpec) -> BTreeMap<String, String> {
    let spec_names: Vec<String> = (0..job.worker_pools.len().max(1))
        .flat_map(|pool| pool_spec_env(job, pool))
        .collect();
    request
        .env
        .iter()
        .filter(|(name, _)| name == TOKEN_KEY || passed_on(name, &spec_names))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// What every object of one attempt shares.
struct Attempt<'a> {
    names: &'a AttemptNames,
    namespace: &'a str,
    labels: BTreeMap<String, String>,
    options: KubernetesOptions,
    output: PodOutput,
    /// The variables the attempt's Secret holds.
    secret_keys: Vec<String>,
}

impl Attempt<'_> {
    fn meta(&self, name: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.to_string()),
            labels: Some(labels),
            ..Default::default()
        }
    }

    /// The headless Service that gives each replica its stable address.
    fn headless_service(&self) -> Service {
        Service {
            metadata: self.meta(self.names.service(), self.labels.clone()),
            spec: Some(ServiceSpec {
                cluster_ip: Some("None".to_string()),
                selector: Some(self.labels.clone()),
                // Replicas must find each other while they start, before any is "ready".
                publish_not_ready_addresses: Some(true),
                ports: Some(vec![ServicePort {
                    name: Some("cluster".to_string()),
                    port: i32::from(CLUSTER_PORT),
                    target_port: Some(IntOrString::Int(i32::from(CLUSTER_PORT))),
                    protocol: Some("TCP".to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The pool's variables: those all its replicas share (the Job's template), and each
    /// replica's own where they differ (set through the scheduling gate; empty: none).
    fn pool_env(
        &self,
        request: &JobRequest,
        job: &TrialJobSpec,
        pool: usize,
        replicas: &[&ReplicaRequest],
    ) -> (Vec<EnvVar>, Vec<BTreeMap<String, String>>) {
        let address = |id: ReplicaId| Address {
            host: self.names.replica_host(id),
            port: CLUSTER_PORT.to_string(),
        };
        let spec_env = pool_spec_env(job, pool);
        let envs: Vec<BTreeMap<String, String>> = replicas
            .iter()
            .map(|r| {
                pod_env(
                    request,
                    r,
                    &address,
                    &self.output,
                    &spec_env,
                    &self.secret_keys,
                )
            })
            .collect();
        // A pool's own `env` wins over a passed-on variable of the same name.
        let from_secret: Vec<&String> = self
            .secret_keys
            .iter()
            .filter(|k| !spec_env.contains(k))
            .collect();
        split_env(&envs, self.names.secret(), &from_secret)
    }

    /// The trainer's container of `pool`'s pods.
    fn container(
        &self,
        request: &JobRequest,
        job: &TrialJobSpec,
        pool: usize,
        first: &ReplicaRequest,
        env: Vec<EnvVar>,
    ) -> Result<Container, ExecutorError> {
        let image = job
            .worker_pools
            .get(pool)
            .and_then(|p| p.as_ref()?.image.clone())
            .or_else(|| job.executor.image().map(str::to_string))
            .ok_or_else(|| {
                ExecutorError::Launch(format!("worker pool {pool} has no image to run"))
            })?;
        let (program, args) = first
            .argv
            .split_first()
            .ok_or_else(|| ExecutorError::Launch("empty command".into()))?;
        Ok(Container {
            name: CONTAINER.to_string(),
            image: Some(image),
            command: Some(vec![literal(program)]),
            args: Some(args.iter().map(|a| literal(a)).collect()),
            env: Some(env),
            resources: resource_requirements(&first.resources),
            ports: request.cluster.as_ref().map(|_| {
                vec![ContainerPort {
                    name: Some("cluster".to_string()),
                    container_port: i32::from(CLUSTER_PORT),
                    protocol: Some("TCP".to_string()),
                    ..Default::default()
                }]
            }),
            volume_mounts: self.output.mount.clone().map(|m| vec![m]),
            working_dir: request
                .workdir
                .as_ref()
                .filter(|d| d.is_absolute())
                .map(|d| d.display().to_string()),
            ..Default::default()
        })
    }

    /// PBT: the init container that replaces the trial's checkpoint directory on the volume
    /// with `parent`'s before `primary` starts, in the primary's image (which must have
    /// `sh` and `cp`). Only the primary's pod copies: one copy per attempt.
    fn checkpoint_copy(
        &self,
        request: &JobRequest,
        parent: TrialId,
        primary: &Container,
    ) -> Container {
        let from = self.output.trial_dirs(request, parent).checkpoints;
        let to = self
            .output
            .trial_dirs(request, request.trial_id)
            .checkpoints;
        let args = [
            CHECKPOINT_COPY_SCRIPT,
            CHECKPOINT_COPY,
            &from.display().to_string(),
            &to.display().to_string(),
        ];
        Container {
            name: CHECKPOINT_COPY.to_string(),
            image: primary.image.clone(),
            command: Some(vec!["sh".to_string(), "-c".to_string()]),
            args: Some(args.iter().map(|a| literal(a)).collect()),
            volume_mounts: self.output.mount.clone().map(|m| vec![m]),
            ..Default::default()
        }
    }

    /// A pod of the attempt; `gated`: held until each replica's own variables are set.
    fn pod_spec(&self, container: Container, gated: bool) -> PodSpec {
        let options = &self.options;
        PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".to_string()),
            subdomain: Some(self.names.service().to_string()),
            // Jobs start from a clean environment: no variables for every Service of the
            // namespace, and no API credentials unless the spec names an account.
            enable_service_links: Some(false),
            automount_service_account_token: Some(options.service_account.is_some()),
            service_account_name: options.service_account.clone(),
            node_selector: (!options.node_selector.is_empty())
                .then(|| options.node_selector.clone()),
            tolerations: (!options.tolerations.is_empty())
                .then(|| options.tolerations.iter().map(toleration).collect()),
            image_pull_secrets: (!options.image_pull_secrets.is_empty()).then(|| {
                options
                    .image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect()
            }),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECS),
            scheduling_gates: gated.then(|| {
                vec![PodSchedulingGate {
                    name: ENV_GATE.to_string(),
                }]
            }),
            volumes: self.output.volume.clone().map(|v| vec![v]),
            ..Default::default()
        }
    }

    /// `pool`'s Indexed Job of `count` pods.
    fn indexed_job(
        &self,
        job: &TrialJobSpec,
        pool: usize,
        count: usize,
        pod: PodSpec,
    ) -> Result<Job, ExecutorError> {
        let count =
            i32::try_from(count).map_err(|_| ExecutorError::Launch("too many replicas".into()))?;
        let mut job_labels = self.labels.clone();
        job_labels.insert(LABEL_POOL.to_string(), pool.to_string());
        let mut pod_labels = self.options.labels.clone();
        pod_labels.extend(job_labels.clone());
        Ok(Job {
            metadata: self.meta(&self.names.job(pool), job_labels),
            spec: Some(JobSpec {
                completion_mode: Some("Indexed".to_string()),
                completions: Some(count),
                parallelism: Some(count),
                // Augur owns retries: a failed pod fails the attempt.
                backoff_limit: Some(0),
                active_deadline_seconds: job.timeout_secs.and_then(|t| i64::try_from(t).ok()),
                ttl_seconds_after_finished: Some(TTL_AFTER_FINISHED_SECS),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(pod_labels),
                        annotations: (!self.options.annotations.is_empty())
                            .then(|| self.options.annotations.clone()),
                        ..Default::default()
                    }),
                    spec: Some(pod),
                },
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// Where a trial's `AIP_*` directories are as its pods see them, and what is mounted there.
struct PodOutput {
    /// The study's base: a path in the pod, or an object-store URI.
    base: String,
    /// Where the study's trials are in `base` (a scratch directory is the pod's alone).
    layout: OutputLayout,
    volume: Option<Volume>,
    mount: Option<VolumeMount>,
}

impl PodOutput {
    fn of(job: &TrialJobSpec) -> PodOutput {
        let options = job.executor.kubernetes();
        // The same layout as on the server: the job's `output_dir` (`study-<id>` in it, unless
        // `output_layout: trial`), or `augur-runs/study-<id>`.
        let relative = job
            .output_dir
            .as_deref()
            .map(|d| d.trim_start_matches('/').trim_end_matches('/').to_string())
            .unwrap_or_else(|| "augur-runs".to_string());
        // `trial` needs an output_dir of the study's own (as in `StudyDir::of`).
        let layout = match (&job.output_dir, job.output_layout) {
            (Some(_), layout) | (None, layout @ OutputLayout::StudyId) => layout,
            (None, _) => OutputLayout::Study,
        };
        let mount = |path: &str| VolumeMount {
            name: OUTPUT_VOLUME.to_string(),
            mount_path: path.to_string(),
            ..Default::default()
        };
        match options.and_then(|o| o.output_volume.as_ref()) {
            Some(OutputVolume::PersistentVolumeClaim {
                claim_name,
                mount_path,
            }) => PodOutput {
                base: format!("{}/{relative}", mount_path.trim_end_matches('/')),
                layout,
                volume: Some(Volume {
                    name: OUTPUT_VOLUME.to_string(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim_name.clone(),
                        read_only: None,
                    }),
                    ..Default::default()
                }),
                mount: Some(mount(mount_path)),
            },
            Some(OutputVolume::ObjectStore) => PodOutput {
                base: job
                    .output_dir
                    .as_deref()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_string(),
                layout,
                volume: None,
                mount: None,
            },
            None => PodOutput {
                base: SCRATCH_OUTPUT_DIR.to_string(),
                layout: OutputLayout::Trial,
                volume: Some(Volume {
                    name: OUTPUT_VOLUME.to_string(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Default::default()
                }),
                mount: Some(mount(SCRATCH_OUTPUT_DIR)),
            },
        }
    }
}

impl PodOutput {
    /// Trial `trial_id`'s directories (of `request`'s study) as its pods see them.
    fn trial_dirs(&self, request: &JobRequest, trial_id: TrialId) -> TrialDirs {
        let key = StudyKey {
            id: request.study_id,
            created_at: request.study_created_at,
        };
        let study = StudyDir::below(PathBuf::from(&self.base), key, self.layout);
        TrialDirs::new(&study, trial_id)
    }
}

/// The names the spec itself sets for a pool's replicas (the job's `env` and the pool's):
/// those are kept even where they name a variable the server's environment also has.
fn pool_spec_env(job: &TrialJobSpec, pool: usize) -> Vec<String> {
    let mut names: Vec<String> = job.env.keys().cloned().collect();
    if let Some(Some(spec)) = job.worker_pools.get(pool) {
        names.extend(spec.env.keys().cloned());
    }
    names
}

/// One replica's variables as its pod must see them: the executor-independent ones
/// (`JobRequest::replica_env`), less the server's own `PATH`, `HOME`, … (an image has its
/// own; the spec's `env` may still set them), with the trial's directories as the pod sees
/// them, the token and the passed-on variables left to the Secret.
fn pod_env(
    request: &JobRequest,
    replica: &ReplicaRequest,
    address: &dyn Fn(ReplicaId) -> Address,
    output: &PodOutput,
    spec_env: &[String],
    secret_keys: &[String],
) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in request.replica_env(replica, address) {
        if is_inherited_env(&name) && !spec_env.contains(&name) {
            continue;
        }
        // Later entries win, as in `replica_env`.
        env.insert(name, value);
    }
    for key in secret_keys.iter().filter(|k| !spec_env.contains(k)) {
        env.remove(key);
    }
    let dirs = output.trial_dirs(request, request.trial_id);
    let dir = |p: &Path| format!("{}/", p.display());
    env.insert(
        "CLOUD_ML_HP_METRIC_FILE".to_string(),
        dirs.replica_metric_file(replica.id).display().to_string(),
    );
    env.insert("AIP_MODEL_DIR".to_string(), dir(&dirs.model));
    env.insert("AIP_CHECKPOINT_DIR".to_string(), dir(&dirs.checkpoints));
    env.insert("AIP_TENSORBOARD_LOG_DIR".to_string(), dir(&dirs.logs));
    env
}

/// A pool's container variables (the same for every pod) and each index's own values (the
/// variables that differ between its replicas), by name.
fn split_env(
    envs: &[BTreeMap<String, String>],
    secret: &str,
    from_secret: &[&String],
) -> (Vec<EnvVar>, Vec<BTreeMap<String, String>>) {
    let mut names: Vec<&String> = envs.iter().flat_map(|e| e.keys()).collect();
    names.sort();
    names.dedup();
    let mut vars = Vec::new();
    let mut differing = Vec::new();
    for name in names {
        let values: Vec<Option<&String>> = envs.iter().map(|e| e.get(name)).collect();
        match values.first() {
            Some(Some(first)) if values.iter().all(|v| *v == Some(*first)) => {
                vars.push(EnvVar {
                    name: name.clone(),
                    value: Some(literal(first)),
                    value_from: None,
                });
            }
            _ => {
                differing.push(name.clone());
                vars.push(EnvVar {
                    name: name.clone(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            api_version: None,
                            field_path: format!(
                                "metadata.annotations['{ENV_ANNOTATION_PREFIX}{name}']"
                            ),
                        }),
                        ..Default::default()
                    }),
                });
            }
        }
    }
    for key in from_secret {
        vars.push(EnvVar {
            name: key.to_string(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.to_string(),
                    key: key.to_string(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
        });
    }
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    let own = if differing.is_empty() {
        Vec::new()
    } else {
        envs.iter()
            .map(|env| {
                differing
                    .iter()
                    .map(|name| {
                        (
                            format!("{ENV_ANNOTATION_PREFIX}{name}"),
                            env.get(name).cloned().unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .collect()
    };
    (vars, own)
}

/// A variable of the server's environment passed on by name (`augur serve --job-env`): not
/// the spec's, not the allow-list every job inherits, not one Augur sets. It may hold a secret
/// (a tracker's API key kept out of specs), so it travels in the attempt's Secret.
fn passed_on(name: &str, spec_names: &[String]) -> bool {
    !spec_names.iter().any(|n| n == name)
        && !is_inherited_env(name)
        && !name.starts_with("AUGUR_")
        && !name.starts_with("AIP_")
        && !name.starts_with("CLOUD_ML_")
        && !CLUSTER_ENV.contains(&name)
}

/// A word as Kubernetes must be given it to pass it on unchanged: the kubelet expands
/// `$(NAME)` in `command`, `args` and `env` values, and reads `$$` as one `$`.
pub fn literal(word: &str) -> String {
    word.replace('$', "$$")
}

/// `resources` as equal requests and limits: `cpu`, `memory`, `nvidia.com/gpu`.
fn resource_requirements(resources: &Resources) -> Option<ResourceRequirements> {
    let mut quantities = BTreeMap::new();
    if let Some(cpu) = resources.cpu {
        let text = if cpu.fract() == 0.0 {
            format!("{}", cpu as u64)
        } else {
            format!("{}m", (cpu * 1000.0).round() as u64)
        };
        quantities.insert("cpu".to_string(), Quantity(text));
    }
    if let Some(memory) = &resources.memory {
        quantities.insert("memory".to_string(), Quantity(memory.trim().to_string()));
    }
    if let Some(gpu) = resources.gpu.filter(|&n| n > 0) {
        quantities.insert("nvidia.com/gpu".to_string(), Quantity(gpu.to_string()));
    }
    (!quantities.is_empty()).then(|| ResourceRequirements {
        limits: Some(quantities.clone()),
        requests: Some(quantities),
        ..Default::default()
    })
}

fn toleration(t: &Toleration) -> KubeToleration {
    KubeToleration {
        key: t.key.clone(),
        operator: t.operator.clone(),
        value: t.value.clone(),
        effect: t.effect.clone(),
        toleration_seconds: t.toleration_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_even_for_the_largest_ids() {
        let names = AttemptNames::new(StudyId::new(i64::MAX), TrialId::new(i64::MIN), u32::MAX);
        assert!(names.job(3).len() <= 63, "{}", names.job(3));
        assert_eq!(
            AttemptNames::new(StudyId::new(3), TrialId::new(7), 2).job(1),
            "augur-s3-t7-a2-wp1"
        );
        assert_eq!(
            AttemptNames::new(StudyId::new(3), TrialId::new(7), 2)
                .replica_host(ReplicaId { pool: 1, index: 4 }),
            "augur-s3-t7-a2-wp1-4.augur-s3-t7-a2"
        );
    }

    #[test]
    fn dollars_are_escaped_from_the_kubelets_expansion() {
        assert_eq!(literal("$(HOME)/x$$y"), "$$(HOME)/x$$$$y");
        assert_eq!(literal("plain"), "plain");
    }

    #[test]
    fn cpu_fractions_become_millicores_and_gpus_nvidia_resources() {
        let r = resource_requirements(&Resources {
            cpu: Some(0.5),
            memory: Some("1Gi".into()),
            gpu: Some(2),
        })
        .and_then(|r| r.limits)
        .unwrap_or_default();
        assert_eq!(r["cpu"].0, "500m");
        assert_eq!(r["memory"].0, "1Gi");
        assert_eq!(r["nvidia.com/gpu"].0, "2");
        assert!(resource_requirements(&Resources::default()).is_none());
    }
}
