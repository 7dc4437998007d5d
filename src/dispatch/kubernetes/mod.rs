//! The Kubernetes executor (DESIGN §4.2): each trial attempt is one Indexed Job per worker
//! pool plus a headless Service and a Secret (`manifests.rs`), watched through the API server
//! (`watch.rs`) until the primary's pod decides it (`outcome.rs`).

pub mod manifests;
pub mod outcome;
mod watch;

use super::handle::JobHandle;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::SinkExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use self::watch::{Driver, Followers};
use super::exec::{ExecVia, forward, refused, refused_replica, terminal_key};
use super::executor::{Executor, ExecutorError, JobExit, JobRequest, RunningJob};
use crate::model::{ReplicaId, StudyId, TrialId, TrialJobSpec};
use crate::service::exec::{
    ExecExit, ExecInput, ExecOutput, ExecRefused, ExecRequest, ExecSession, ExecTarget,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use manifests::{
    AttemptManifests, LABEL_ATTEMPT, LABEL_MANAGED_BY, LABEL_STUDY, LABEL_TRIAL, attempt_manifests,
    attempt_selector, trial_selector,
};
use manifests::{AttemptNames, COMPLETION_INDEX, CONTAINER, JOB_NAME_LABEL};

/// How long a pod may wait for its image unless the spec says (`image_pull_timeout_secs`).
pub const DEFAULT_IMAGE_PULL_TIMEOUT: Duration = Duration::from_secs(300);
/// After the attempt is decided, how long the primary's log may take to be read to its end.
const LOG_DRAIN: Duration = Duration::from_secs(10);
/// How long a deleted attempt's pods may take to go, beyond their grace period.
const POD_GONE_WAIT: Duration = Duration::from_secs(30);
/// How long the watch of a new attempt may take to start (its first list).
const WATCH_READY: Duration = Duration::from_secs(30);
/// How often the disappearance of deleted pods is checked.
const GONE_POLL: Duration = Duration::from_millis(250);

/// How the server reaches Kubernetes (`augur serve --kubeconfig/--kube-context/--kubernetes-namespace`).
#[derive(Debug, Clone, Default)]
pub struct KubeSettings {
    /// Namespace of trials whose spec names none (default: the kubeconfig context's, the
    /// in-cluster service account's, or `default`).
    pub namespace: Option<String>,
    /// A kubeconfig file (default: `$KUBECONFIG`, `~/.kube/config`, or in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// A context of the kubeconfig (default: its current one).
    pub context: Option<String>,
}

/// The process's one Kubernetes client, made on first use and shared by every study.
#[derive(Clone, Default)]
pub struct KubeConnection {
    settings: Arc<KubeSettings>,
    client: Arc<OnceCell<(Client, String)>>,
}

impl KubeConnection {
    pub fn new(settings: KubeSettings) -> Self {
        Self {
            settings: Arc::new(settings),
            client: Arc::default(),
        }
    }

    /// The client and the default namespace. A failure is not remembered: the next trial
    /// tries again (a kubeconfig fixed meanwhile is picked up).
    pub async fn client(&self) -> Result<(Client, String), ExecutorError> {
        self.client
            .get_or_try_init(|| connect(&self.settings))
            .await
            .cloned()
            .map_err(ExecutorError::KubernetesConnect)
    }
}

/// Why no client could be made from the operator's settings (shared: the first try's error
/// is every later caller's too).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("no kubeconfig and not in a cluster: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("client: {0}")]
    Client(#[source] kube::Error),
}

async fn connect(settings: &KubeSettings) -> Result<(Client, String), Arc<ConnectError>> {
    let options = KubeConfigOptions {
        context: settings.context.clone(),
        cluster: None,
        user: None,
    };
    let kubeconfig_error = |path: &str| {
        let path = path.to_string();
        move |source| Arc::new(ConnectError::Kubeconfig { path, source })
    };
    let config = match &settings.kubeconfig {
        Some(path) => {
            let shown = path.display().to_string();
            let kubeconfig = Kubeconfig::read_from(path).map_err(kubeconfig_error(&shown))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(kubeconfig_error(&shown))?
        }
        None if settings.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(kubeconfig_error("(default)"))?,
        None => Config::infer()
            .await
            .map_err(|e| Arc::new(ConnectError::Infer(e)))?,
    };
    let namespace = settings
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| Arc::new(ConnectError::Client(e)))?;
    Ok((client, namespace))
}

fn api_error(what: &str, source: kube::Error) -> ExecutorError {
    ExecutorError::Kubernetes {
        what: what.to_string(),
        source,
    }
}

/// The four kinds of object an attempt has, in its namespace.
#[derive(Clone)]
struct Apis {
    namespace: String,
    jobs: Api<Job>,
    pods: Api<Pod>,
    services: Api<Service>,
    secrets: Api<Secret>,
}

impl Apis {
    fn new(client: Client, namespace: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            jobs: Api::namespaced(client.clone(), namespace),
            pods: Api::namespaced(client.clone(), namespace),
            services: Api::namespaced(client.clone(), namespace),
            secrets: Api::namespaced(client, namespace),
        }
    }

    /// Delete the Jobs, Services and Secrets `selector` matches (their pods go with their
    /// Jobs, in the background). Returns how many objects were deleted.
    async fn delete_selected(&self, selector: &str) -> usize {
        delete_matching(&self.jobs, selector).await
            + delete_matching(&self.services, selector).await
            + delete_matching(&self.secrets, selector).await
    }

    /// Wait until no pod `selector` matches (and `keep` accepts) is left, up to `limit`.
    async fn pods_gone(&self, selector: &str, limit: Duration, keep: impl Fn(&Pod) -> bool) {
        let deadline = Instant::now() + limit;
        let params = ListParams::default().labels(selector);
        while Instant::now() < deadline {
            match self.pods.list(&params).await {
                Ok(list) if !list.items.iter().any(&keep) => return,
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "listing pods"),
            }
            tokio::time::sleep(GONE_POLL).await;
        }
        tracing::warn!(selector, "pods still present after {} s", limit.as_secs());
    }
}

/// Delete with propagation Background: the object goes now, its dependents (a Job's pods)
/// are removed by the garbage collector.
fn background() -> DeleteParams {
    DeleteParams::background()
}

async fn delete_matching<K>(api: &Api<K>, selector: &str) -> usize
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let items = match api.list(&ListParams::default().labels(selector)).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(selector, error = %e, "kubernetes: could not list leftovers");
            return 0;
        }
    };
    let mut deleted = 0;
    for item in items {
        if delete_named(api, &item.name_any()).await {
            deleted += 1;
        }
    }
    deleted
}

/// Delete one object (Background); gone already is fine.
async fn delete_named<K>(api: &Api<K>, name: &str) -> bool
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &background()).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        Err(e) => {
            tracing::warn!(name, error = %e, "kubernetes: could not delete");
            false
        }
    }
}

/// Create an object, or adopt the one of the same name that an earlier run of this attempt
/// made (one being deleted is waited out and made anew; another's is an error).
async fn create_or_adopt<K>(api: &Api<K>, object: &K) -> Result<K, ExecutorError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = object.name_any();
    let deadline = Instant::now() + POD_GONE_WAIT;
    loop {
        match api.create(&PostParams::default(), object).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api_error(&format!("creating {name}"), e)),
        }
        match api.get_opt(&name).await {
            Ok(Some(existing)) if existing.meta().deletion_timestamp.is_none() => {
                let ours = [LABEL_MANAGED_BY, LABEL_STUDY, LABEL_TRIAL, LABEL_ATTEMPT]
                    .iter()
                    .all(|k| existing.labels().get(*k) == object.labels().get(*k));
                if !ours {
                    return Err(ExecutorError::Launch(format!(
                        "kubernetes: {name} exists and is not this trial attempt's"
                    )));
                }
                tracing::info!(name, "kubernetes: adopting the existing object");
                return Ok(existing);
            }
            Ok(_) => {}
            Err(e) => return Err(api_error(&format!("reading {name}"), e)),
        }
        if Instant::now() >= deadline {
            return Err(ExecutorError::Launch(format!(
                "kubernetes: {name} is still being deleted"
            )));
        }
        tokio::time::sleep(GONE_POLL).await;
    }
}

/// Runs trials of one study's job on Kubernetes.
///
/// The Kubernetes executor (DESIGN §4.2): each trial attempt is one Indexed Job per worker
/// pool plus a headless Service and a Secret (`manifests.rs`), watched through the API server
/// (`watch.rs`) until the primary's pod decides it (`outcome.rs`); every pod's log is streamed
/// into its replica's log file, the primary's also line by line to the metric parser. Stop, timeout,
/// early stopping and the attempt's end delete its objects (propagation Background). Nothing
/// of a trial is kept in Kubernetes beyond its running Jobs: a restarted service finds
/// leftovers by label and deletes them (`clean_up_stale`).
///
/// The client is made once per process, on first use, from `--kubeconfig`/`--kube-context`
/// or else the usual inference (`$KUBECONFIG`, `~/.kube/config`, then the in-cluster
/// service account).
pub struct KubernetesExecutor {
    connection: KubeConnection,
    job: TrialJobSpec,
}

impl KubernetesExecutor {
    pub fn new(connection: KubeConnection, job: TrialJobSpec) -> Self {
        Self { connection, job }
    }

    async fn apis(&self, handle_namespace: Option<&str>) -> Result<Apis, ExecutorError> {
        let (client, default_namespace) = self.connection.client().await?;
        let namespace = handle_namespace
            .map(str::to_string)
            .or_else(|| self.job.executor.kubernetes()?.namespace.clone())
            .unwrap_or(default_namespace);
        Ok(Apis::new(client, &namespace))
    }

    fn pull_timeout(&self) -> Duration {
        self.job
            .executor
            .kubernetes()
            .and_then(|k| k.image_pull_timeout_secs)
            .map_or(DEFAULT_IMAGE_PULL_TIMEOUT, Duration::from_secs)
    }
}

#[async_trait]
impl Executor for KubernetesExecutor {
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError> {
        let apis = self.apis(None).await?;
        let manifests = attempt_manifests(request, &self.job, &apis.namespace)?;
        warn_if_unreachable(request);
        // Only one attempt of a trial runs: an earlier one's leftovers go first.
        let others = format!(
            "{},{LABEL_ATTEMPT}!={}",
            trial_selector(request.study_id, request.trial_id),
            request.attempt
        );
        apis.delete_selected(&others).await;
        // The watch is in place before anything is created, so that no event of the
        // attempt's objects can be missed (a pod may vanish before a later list).
        let (created_tx, created_rx) = oneshot::channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let (decided_tx, decision) = tokio::sync::watch::channel(None);
        let followers = Arc::new(Mutex::new(Followers::default()));
        let selector = attempt_selector(request.study_id, request.trial_id, request.attempt);
        let logs = request
            .replicas
            .iter()
            .map(|r| (r.id, (request.output_base.clone(), r.log_path.clone())))
            .collect();
        let driver = Driver::new(
            apis.clone(),
            selector.clone(),
            Arc::new(manifests.clone()),
            self.pull_timeout(),
            logs,
            followers.clone(),
            stdout_lines,
        );
        let driver = tokio::spawn(driver.run(decided_tx, ready_tx, created_rx));
        if !matches!(
            tokio::time::timeout(WATCH_READY, ready_rx).await,
            Ok(Ok(()))
        ) {
            driver.abort();
            return Err(ExecutorError::Launch(format!(
                "kubernetes: could not watch pods and Jobs in namespace {} within {} s",
                apis.namespace,
                WATCH_READY.as_secs()
            )));
        }
        let created = match create_attempt(&apis, &manifests).await {
            Ok(created) => created,
            Err(e) => {
                driver.abort();
                // Nothing of an attempt that could not start whole is left behind.
                apis.delete_selected(&selector).await;
                return Err(e);
            }
        };
        let _ = created_tx.send(created.uids.clone());
        Ok(Box::new(KubeAttempt {
            handle: JobHandle::Kubernetes {
                namespace: apis.namespace.clone(),
                attempt: manifests.names.base.clone(),
            },
            apis,
            selector,
            uids: created.uids,
            jobs: created.jobs,
            service: manifests.names.service().to_string(),
            secret: manifests.secret.as_ref().map(|s| s.name_any()),
            decision,
            driver,
            followers,
            drain_until: None,
            draining: None,
            finished: None,
        }))
    }

    /// The pods' trial directories are on their volume: PBT copies in the pod.
    fn shares_trial_dirs(&self) -> bool {
        false
    }

    async fn clean_up_stale(&self, handle: &JobHandle, study_id: StudyId, trial_id: TrialId) {
        let JobHandle::Kubernetes { namespace, .. } = handle else {
            return;
        };
        let apis = match self.apis(Some(namespace.as_str())).await {
            Ok(apis) => apis,
            Err(e) => {
                tracing::warn!(%study_id, %trial_id, error = %e, "cannot look for leftover Jobs");
                return;
            }
        };
        let selector = trial_selector(study_id, trial_id);
        let deleted = apis.delete_selected(&selector).await;
        if deleted > 0 {
            tracing::info!(
                %study_id,
                %trial_id,
                deleted,
                "kubernetes: deleted a leftover attempt"
            );
        }
        // A resumed trial never runs twice: its old pods are gone before the new ones start.
        apis.pods_gone(&selector, POD_GONE_WAIT, |_| true).await;
    }

    /// The pod API's `exec` (a WebSocket through the API server) in the container of the
    /// replica's running pod: the environment, directory and user the image and the spec
    /// give it. Kubernetes has no signals in `exec`: with a terminal, INT and QUIT are its
    /// keys (Ctrl-C, Ctrl-\\); without one they cannot be sent.
    async fn exec(
        &self,
        handle: &JobHandle,
        _target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecVia, ExecRefused> {
        let JobHandle::Kubernetes { namespace, attempt } = handle else {
            return Err(refused(format!("not a Kubernetes job: {handle}")));
        };
        let apis = self
            .apis(Some(namespace.as_str()))
            .await
            .map_err(|e| refused(e.to_string()))?;
        let job = AttemptNames::job_of(attempt, request.replica.pool);
        let params = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={job}"));
        let pods = apis
            .pods
            .list(&params)
            .await
            .map_err(|e| refused(format!("the pods of {job}: {e}")))?;
        let index = request.replica.index.to_string();
        let pod = pods
            .items
            .into_iter()
            .find(|p| {
                p.labels().get(COMPLETION_INDEX) == Some(&index)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .ok_or_else(|| {
                refused_replica(format!(
                    "replica {} has no running pod in {namespace}",
                    request.replica.name()
                ))
            })?;
        let attach = AttachParams {
            container: Some(CONTAINER.to_string()),
            stdin: true,
            stdout: true,
            stderr: !request.tty,
            tty: request.tty,
            ..AttachParams::default()
        };
        let attached = apis
            .pods
            .exec(&pod.name_any(), request.command.clone(), &attach)
            .await
            .map_err(|e| refused(format!("exec in pod {}: {e}", pod.name_any())))?;
        Ok(ExecVia::Session(attached_session(attached, request)))
    }
}

/// A session over a pod's `exec` stream: stdin to it (its end closes the pod's stdin, on
/// protocol v5), output and the exit code (from the final `Status`) back, resizes to its
/// terminal; the stream is aborted when the client goes.
fn attached_session(mut attached: AttachedProcess, request: &ExecRequest) -> ExecSession {
    let (input_tx, mut input_rx) = mpsc::channel::<ExecInput>(64);
    let (output_tx, output_rx) = mpsc::channel::<ExecOutput>(64);
    let tty = request.tty;
    let mut stdin = attached.stdin();
    let stdout = attached.stdout();
    let stderr = attached.stderr();
    let mut resize = attached.terminal_size();
    let status = attached.take_status();
    if let (Some(resize), true) = (resize.as_mut(), tty) {
        let _ = resize.try_send(TerminalSize {
            width: request.cols,
            height: request.rows,
        });
    }
    tokio::spawn(async move {
        let mut readers = tokio::task::JoinSet::new();
        if let Some(out) = stdout {
            readers.spawn(forward(
                Box::new(out),
                output_tx.clone(),
                ExecOutput::Stdout,
            ));
        }
        if let Some(err) = stderr {
            readers.spawn(forward(
                Box::new(err),
                output_tx.clone(),
                ExecOutput::Stderr,
            ));
        }
        let mut status = std::pin::pin!(async move {
            match status {
                Some(status) => status.await,
                None => None,
            }
        });
        let status = loop {
            tokio::select! {
                status = &mut status => break status,
                message = input_rx.recv() => match message {
                    Some(ExecInput::Stdin(bytes)) => {
                        if let Some(writer) = stdin.as_mut()
                            && (writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err())
                        {
                            stdin = None;
                        }
                    }
                    Some(ExecInput::Eof) => {
                        if let Some(mut writer) = stdin.take() {
                            let _ = writer.shutdown().await;
                        }
                    }
                    Some(ExecInput::Resize { rows, cols }) => {
                        if let Some(resize) = resize.as_mut() {
                            let _ = resize.send(TerminalSize { width: cols, height: rows }).await;
                        }
                    }
                    Some(ExecInput::Signal(signal)) => {
                        if let (Some(writer), Some(key), true) = (stdin.as_mut(), terminal_key(signal), tty) {
                            let _ = writer.write_all(&[key]).await;
                            let _ = writer.flush().await;
                        }
                    }
                    None => {
                        // The client went away: so does the stream (the API server ends the
                        // command with it).
                        attached.abort();
                        return;
                    }
                },
            }
        };
        let drained = tokio::time::timeout(LOG_DRAIN, async {
            while readers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            readers.abort_all();
        }
        let _ = output_tx
            .send(ExecOutput::Exit(exit_of_status(status.as_ref())))
            .await;
    });
    ExecSession {
        input: input_tx,
        output: output_rx,
    }
}

/// The exit of an `exec` from its final `Status`: `Success`, or the `ExitCode` cause of a
/// `NonZeroExitCode` failure; 255 when the stream ended without one (the pod went).
fn exit_of_status(status: Option<&Status>) -> ExecExit {
    let Some(status) = status else {
        return ExecExit::Exited(255);
    };
    if status.status.as_deref() == Some("Success") {
        return ExecExit::Exited(0);
    }
    let code = status
        .details
        .as_ref()
        .and_then(|d| d.causes.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.parse::<i32>().ok());
    ExecExit::Exited(code.unwrap_or(255))
}

/// Pods report to `AUGUR_URL`: a loopback address reaches no server from a pod.
fn warn_if_unreachable(request: &JobRequest) {
    let url = request
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "AUGUR_URL")
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    if url.contains("://127.") || url.contains("://localhost") || url.contains("://[::1]") {
        tracing::warn!(
            url,
            "pods cannot reach AUGUR_URL at a loopback address: start the server with \
             --public-url (metrics from the primary's stdout still work)"
        );
    }
}

/// The created (or adopted) Jobs: uid → pool, and the names by pool.
struct Created {
    uids: BTreeMap<String, usize>,
    jobs: Vec<(usize, String)>,
}

/// Secret, Service, then the Jobs (the primary's first); then the Secret and the Service
/// are made dependents of the primary's Job, so that Kubernetes removes them with it should
/// Augur not.
async fn create_attempt(
    apis: &Apis,
    manifests: &AttemptManifests,
) -> Result<Created, ExecutorError> {
    if let Some(secret) = &manifests.secret {
        let existing = create_or_adopt(&apis.secrets, secret).await?;
        if existing.string_data.is_none() && existing.data.is_some() {
            // Adopted: this attempt's token replaces the earlier one's.
            let patch = json!({"stringData": secret.string_data});
            apis.secrets
                .patch(
                    manifests.names.secret(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .map_err(|e| api_error("updating the token", e))?;
        }
    }
    create_or_adopt(&apis.services, &manifests.service).await?;
    let mut created = Created {
        uids: BTreeMap::new(),
        jobs: Vec::new(),
    };
    for (pool, job) in &manifests.jobs {
        let made = create_or_adopt(&apis.jobs, job).await?;
        let uid = made.uid().ok_or_else(|| {
            ExecutorError::Launch(format!("kubernetes: Job {} has no uid", made.name_any()))
        })?;
        created.uids.insert(uid, *pool);
        created.jobs.push((*pool, made.name_any()));
    }
    let primary = manifests.jobs.first().map(|(_, job)| job.name_any());
    let primary_uid = created
        .uids
        .iter()
        .find(|(_, pool)| **pool == 0)
        .map(|(uid, _)| uid.clone());
    if let (Some(name), Some(uid)) = (primary, primary_uid) {
        let owner = OwnerReference {
            api_version: "batch/v1".to_string(),
            kind: "Job".to_string(),
            name,
            uid,
            controller: None,
            block_owner_deletion: None,
        };
        let patch = Patch::Merge(json!({"metadata": {"ownerReferences": [owner]}}));
        let params = PatchParams::default();
        let service = apis
            .services
            .patch(manifests.names.service(), &params, &patch);
        if let Err(e) = service.await {
            tracing::warn!(error = %e, "kubernetes: could not make the Service the Job's");
        }
        if manifests.secret.is_some()
            && let Err(e) = apis
                .secrets
                .patch(manifests.names.secret(), &params, &patch)
                .await
        {
            tracing::warn!(error = %e, "kubernetes: could not make the Secret the Job's");
        }
    }
    Ok(created)
}

/// One running attempt.
struct KubeAttempt {
    apis: Apis,
    selector: String,
    handle: JobHandle,
    uids: BTreeMap<String, usize>,
    jobs: Vec<(usize, String)>,
    service: String,
    secret: Option<String>,
    decision: tokio::sync::watch::Receiver<Option<JobExit>>,
    driver: JoinHandle<()>,
    followers: Arc<Mutex<Followers>>,
    /// Set once the attempt is decided (and the other pools' Jobs deleted): the log drain
    /// may not take longer than this.
    drain_until: Option<Instant>,
    /// The log followers being waited for, the primary's first; kept here so that a wait
    /// dropped meanwhile (the trial loop drops it whenever a line arrives) loses none.
    draining: Option<Vec<(ReplicaId, JoinHandle<()>)>>,
    finished: Option<JobExit>,
}

impl KubeAttempt {
    async fn delete_jobs(&self, primary_too: bool) {
        for (pool, name) in &self.jobs {
            if *pool != 0 || primary_too {
                delete_named(&self.apis.jobs, name).await;
            }
        }
    }

    async fn delete_all(&self) {
        self.delete_jobs(true).await;
        delete_named(&self.apis.services, &self.service).await;
        if let Some(secret) = &self.secret {
            delete_named(&self.apis.secrets, secret).await;
        }
    }

    /// Wait for the log followers (the primary's first) until `until`; abort the rest then.
    /// Cancel-safe: a follower not yet waited for stays in `draining`.
    async fn drain_logs(&mut self, until: Instant) {
        if self.draining.is_none() {
            let mut tasks: Vec<(ReplicaId, JoinHandle<()>)> = match self.followers.lock() {
                Ok(mut f) => std::mem::take(&mut f.tasks).into_values().collect(),
                Err(_) => Vec::new(),
            };
            tasks.sort_by_key(|(id, _)| !id.is_primary());
            self.draining = Some(tasks);
        }
        while let Some((_, task)) = self.draining.as_mut().and_then(|t| t.first_mut()) {
            if tokio::time::timeout_at(until, &mut *task).await.is_err() {
                task.abort();
            }
            if let Some(tasks) = self.draining.as_mut() {
                tasks.remove(0);
            }
        }
    }
}

impl Drop for KubeAttempt {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

#[async_trait]
impl RunningJob for KubeAttempt {
    fn handle(&self) -> JobHandle {
        self.handle.clone()
    }

    async fn wait(&mut self) -> JobExit {
        if let Some(exit) = &self.finished {
            return exit.clone();
        }
        let exit = loop {
            if let Some(exit) = self.decision.borrow_and_update().clone() {
                break exit;
            }
            if self.decision.changed().await.is_err() {
                break self.decision.borrow().clone().unwrap_or_else(|| {
                    JobExit::Lost("the watch of the attempt ended".to_string())
                });
            }
        };
        // Cancel-safe from here on: a step cut short runs again when this wait is.
        if self.drain_until.is_none() {
            // The primary has ended (or a replica failed): the other pools' pods stop now.
            self.delete_jobs(false).await;
            self.drain_until = Some(Instant::now() + LOG_DRAIN);
        }
        let until = self.drain_until.unwrap_or_else(Instant::now);
        self.drain_logs(until).await;
        self.delete_all().await;
        self.finished = Some(exit.clone());
        exit
    }

    async fn stop(&mut self, grace: Duration) {
        self.driver.abort();
        self.delete_all().await;
        let uids = self.uids.clone();
        let ours = move |pod: &Pod| outcome::replica_of(pod, &uids).is_some();
        self.apis
            .pods_gone(&self.selector, grace + POD_GONE_WAIT, ours)
            .await;
        self.drain_logs(Instant::now() + Duration::from_secs(2))
            .await;
        self.finished
            .get_or_insert(JobExit::Lost("stopped by Augur".to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_for_a_tls_cluster_is_made_with_rustls_and_ring() {
        // The tests' stand-in speaks plain HTTP; real clusters speak TLS: the TLS stack must
        // at least be buildable (a missing crypto provider would panic here).
        let url = "https://127.0.0.1:6443".parse().map_err(|e| format!("{e}"));
        let config = Config::new(url.expect("a URL"));
        assert!(Client::try_from(config).is_ok());
    }
}
