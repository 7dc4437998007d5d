//! Following one running attempt: the watch of its pods and Jobs (kube's `watcher`, started
//! before the objects exist so that no event is missed), each gated pod given its own
//! variables and ungated, each pod's log streamed into its replica's file (the primary's also
//! to the metric parser), and the tracker (`outcome.rs`) fed until it decides the attempt.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, LogParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::super::executor::{JobExit, open_log};
use super::Apis;
use super::manifests::{AttemptManifests, CONTAINER, ENV_GATE};
use super::outcome::{PodView, Tracker, pod_view};
use crate::model::ReplicaId;

/// Log followers by pod name; the primary's is the one whose end closes the stdout channel.
#[derive(Default)]
pub(super) struct Followers {
    pub(super) tasks: BTreeMap<String, (ReplicaId, JoinHandle<()>)>,
}

/// Watches one attempt's pods and Jobs until it is decided: lifts each gated pod's gate
/// once its own variables are written, starts a log follower for each pod that runs, and
/// feeds the tracker.
pub(super) struct Driver {
    apis: Apis,
    selector: String,
    manifests: Arc<AttemptManifests>,
    tracker: Tracker,
    /// This attempt's Jobs: uid → pool.
    uids: BTreeMap<String, usize>,
    /// Each replica's log: the study's output directory and the log's path below it.
    logs: BTreeMap<ReplicaId, (PathBuf, PathBuf)>,
    followers: Arc<Mutex<Followers>>,
    /// The primary's stdout lines go here; moved into its log follower.
    stdout: Option<mpsc::UnboundedSender<String>>,
    ungated: Arc<Mutex<HashSet<String>>>,
    /// The attempt's pods as last seen, by name.
    last_seen: BTreeMap<String, Pod>,
}

impl Driver {
    pub(super) fn new(
        apis: Apis,
        selector: String,
        manifests: Arc<AttemptManifests>,
        pull_timeout: Duration,
        logs: BTreeMap<ReplicaId, (PathBuf, PathBuf)>,
        followers: Arc<Mutex<Followers>>,
        stdout: mpsc::UnboundedSender<String>,
    ) -> Self {
        Self {
            apis,
            selector,
            manifests,
            tracker: Tracker::new(BTreeMap::new(), pull_timeout),
            uids: BTreeMap::new(),
            logs,
            followers,
            stdout: Some(stdout),
            ungated: Arc::default(),
            last_seen: BTreeMap::new(),
        }
    }

    /// Watch until the attempt is decided. `ready` is told once both watches have made
    /// their first list (objects created after that cannot be missed); `created` brings the
    /// uids of the attempt's Jobs. Events before it are kept (the latest of each object)
    /// and replayed then.
    pub(super) async fn run(
        mut self,
        decided: watch::Sender<Option<JobExit>>,
        ready: oneshot::Sender<()>,
        mut created: oneshot::Receiver<BTreeMap<String, usize>>,
    ) {
        let config = watcher::Config::default().labels(&self.selector);
        let pods = watcher::watcher(self.apis.pods.clone(), config.clone()).default_backoff();
        let jobs = watcher::watcher(self.apis.jobs.clone(), config).default_backoff();
        futures::pin_mut!(pods, jobs);
        let (mut pods_listed, mut jobs_listed) = (false, false);
        let mut ready = Some(ready);
        let mut known = false;
        let mut early_pods: BTreeMap<String, (Pod, bool)> = BTreeMap::new();
        let mut early_jobs: BTreeMap<String, (Job, bool)> = BTreeMap::new();
        let mut relisted: HashSet<String> = HashSet::new();
        loop {
            if pods_listed
                && jobs_listed
                && let Some(ready) = ready.take()
            {
                let _ = ready.send(());
            }
            let deadline = self.tracker.next_deadline();
            tokio::select! {
                uids = &mut created, if !known => {
                    let Ok(uids) = uids else { return };
                    known = true;
                    self.tracker.set_jobs(uids.clone());
                    self.uids = uids;
                    for (job, deleted) in std::mem::take(&mut early_jobs).into_values() {
                        self.job_event(job, deleted);
                    }
                    for (pod, deleted) in std::mem::take(&mut early_pods).into_values() {
                        if deleted {
                            self.pod_deleted(pod).await;
                        } else {
                            self.pod(pod);
                        }
                    }
                }
                event = pods.try_next() => match event {
                    Ok(Some(Event::Apply(pod) | Event::InitApply(pod))) if !known => {
                        early_pods.insert(pod.name_any(), (pod, false));
                    }
                    Ok(Some(Event::Delete(pod))) if !known => {
                        early_pods.insert(pod.name_any(), (pod, true));
                    }
                    Ok(Some(Event::Apply(pod))) => self.pod(pod),
                    Ok(Some(Event::InitApply(pod))) => {
                        relisted.insert(pod.name_any());
                        self.pod(pod);
                    }
                    Ok(Some(Event::Delete(pod))) => self.pod_deleted(pod).await,
                    Ok(Some(Event::InitDone)) => {
                        pods_listed = true;
                        // A pod deleted while the watch was down is missing from the new
                        // list and was never seen deleted.
                        let gone: Vec<Pod> = self
                            .last_seen
                            .iter()
                            .filter(|(name, _)| !relisted.contains(*name))
                            .map(|(_, pod)| pod.clone())
                            .collect();
                        for pod in gone {
                            self.pod_deleted(pod).await;
                        }
                    }
                    Ok(Some(Event::Init)) => relisted.clear(),
                    Ok(None) => break,
                    Err(e) => tracing::debug!(error = %e, "kubernetes: pod watch"),
                },
                event = jobs.try_next() => match event {
                    Ok(Some(Event::Apply(job) | Event::InitApply(job))) if !known => {
                        early_jobs.insert(job.name_any(), (job, false));
                    }
                    Ok(Some(Event::Delete(job))) if !known => {
                        early_jobs.insert(job.name_any(), (job, true));
                    }
                    Ok(Some(Event::Apply(job) | Event::InitApply(job))) => self.job_event(job, false),
                    Ok(Some(Event::Delete(job))) => self.job_event(job, true),
                    Ok(Some(Event::InitDone)) => jobs_listed = true,
                    Ok(Some(Event::Init)) => {}
                    Ok(None) => break,
                    Err(e) => tracing::debug!(error = %e, "kubernetes: job watch"),
                },
                _ = sleep_until(deadline) => self.tracker.tick(Instant::now()),
            }
            if let Some(exit) = self.tracker.decided() {
                let _ = decided.send(Some(exit.clone()));
                return;
            }
        }
        let _ = decided.send(Some(JobExit::Lost(
            "the watch of the attempt's pods ended".to_string(),
        )));
    }

    fn job_event(&mut self, job: Job, deleted: bool) {
        if !self.is_ours(&job) {
            return;
        }
        if deleted {
            self.tracker.job_deleted(&job);
        } else {
            self.tracker.job(&job);
        }
    }

    /// One of this attempt's Jobs (by uid: a same-named Job of an earlier run is not).
    fn is_ours(&self, job: &Job) -> bool {
        job.uid().is_some_and(|uid| self.uids.contains_key(&uid))
    }

    /// A pod is gone. Its Job may say why (a deadline), in an event of the other watch that
    /// may not have come yet: asked first.
    async fn pod_deleted(&mut self, pod: Pod) {
        if self.tracker.decided().is_none() && self.tracker.replica_of(&pod).is_some() {
            let owner = pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| self.uids.contains_key(&o.uid))
                .map(|o| o.name.clone());
            if let Some(owner) = owner
                && let Ok(Some(job)) = self.apis.jobs.get_opt(&owner).await
                && job.uid().is_some_and(|uid| self.uids.contains_key(&uid))
            {
                self.tracker.job(&job);
            }
        }
        self.last_seen.remove(&pod.name_any());
        self.tracker.pod_deleted(&pod);
    }

    fn pod(&mut self, pod: Pod) {
        self.last_seen.insert(pod.name_any(), pod.clone());
        if let Some(replica) = self.tracker.replica_of(&pod) {
            self.ungate(&pod, replica);
            self.follow(&pod, replica);
        }
        self.tracker.pod(&pod, Instant::now());
    }

    /// Write a gated pod's own variables into its annotations and lift the gate, once.
    fn ungate(&self, pod: &Pod, replica: ReplicaId) {
        let gated = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| g.iter().any(|g| g.name == ENV_GATE));
        let Some(annotations) = self.manifests.annotations_for(replica) else {
            return;
        };
        let name = pod.name_any();
        if !gated
            || !self
                .ungated
                .lock()
                .is_ok_and(|mut u| u.insert(name.clone()))
        {
            return;
        }
        // The other gates (none that Augur sets) are kept.
        let gates: Vec<_> = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|g| g.name != ENV_GATE)
            .collect();
        let gates = if gates.is_empty() {
            serde_json::Value::Null
        } else {
            json!(gates)
        };
        let patch = json!({
            "metadata": {"annotations": annotations},
            "spec": {"schedulingGates": gates},
        });
        let (pods, ungated) = (self.apis.pods.clone(), self.ungated.clone());
        tokio::spawn(async move {
            for attempt in 0..5u32 {
                match pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 404 => return,
                    Err(e) => {
                        tracing::warn!(pod = name, error = %e, "kubernetes: could not ungate a pod");
                        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    }
                }
            }
            // The next event of the pod tries again.
            if let Ok(mut u) = ungated.lock() {
                u.remove(&name);
            }
        });
    }

    /// Start streaming a pod's log into its replica's file once its container has started.
    fn follow(&mut self, pod: &Pod, replica: ReplicaId) {
        let started = match pod_view(pod) {
            PodView::Running => true,
            PodView::Ended(_) => pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some())),
            PodView::Waiting(_) => false,
        };
        let name = pod.name_any();
        let Ok(mut followers) = self.followers.lock() else {
            return;
        };
        if !started || followers.tasks.contains_key(&name) {
            return;
        }
        let Some((base, path)) = self.logs.get(&replica).cloned() else {
            return;
        };
        let stdout = if replica.is_primary() {
            self.stdout.take()
        } else {
            None
        };
        let task = tokio::spawn(follow_log(
            self.apis.pods.clone(),
            name.clone(),
            (base, path),
            stdout,
        ));
        followers.tasks.insert(name, (replica, task));
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Stream a pod's log (`follow=true`) into `path`, each line also to `stdout` (the
/// primary's). A stream that breaks while the pod still runs is opened again and the lines
/// already written are skipped.
async fn follow_log(
    pods: Api<Pod>,
    name: String,
    (base, path): (PathBuf, PathBuf),
    stdout: Option<mpsc::UnboundedSender<String>>,
) {
    let Ok(mut file) = open_log(&base, &path).await else {
        return;
    };
    let mut written = 0usize;
    loop {
        let params = LogParams {
            container: Some(CONTAINER.to_string()),
            follow: true,
            ..Default::default()
        };
        match pods.log_stream(&name, &params).await {
            Ok(stream) => {
                let lines = stream.lines();
                futures::pin_mut!(lines);
                let mut seen = 0usize;
                while let Some(Ok(line)) = lines.next().await {
                    seen += 1;
                    if seen <= written {
                        continue;
                    }
                    written += 1;
                    if let Some(tx) = &stdout {
                        let _ = tx.send(line.clone());
                    }
                    if file.write_all(line.as_bytes()).await.is_err()
                        || file.write_all(b"\n").await.is_err()
                    {
                        return;
                    }
                }
            }
            Err(e) => tracing::debug!(pod = name, error = %e, "kubernetes: log stream"),
        }
        // The stream ended: the container is done, or the connection broke.
        match pods.get_opt(&name).await {
            Ok(Some(pod)) if !matches!(pod_view(&pod), PodView::Ended(_)) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            _ => break,
        }
    }
    let _ = file.flush().await;
}
