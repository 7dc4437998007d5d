//! How an attempt ends, from what the API server says of its pods and Jobs (DESIGN §4.1):
//! the primary's pod decides; a pod of another pool that fails first fails the attempt; an
//! OOM kill, an image that cannot be pulled (after a bounded wait), an eviction, a pod that
//! vanished (node lost, deleted) or a Job past its deadline are failures with a reason the
//! user can read. Pure: fed pods and Jobs as the watch delivers them, and the time.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tokio::time::Instant;

use super::super::executor::JobExit;
use super::manifests::{COMPLETION_INDEX, CONTAINER};
use crate::model::ReplicaId;

/// Waiting reasons of a container whose image cannot be pulled (yet): given the bounded wait.
const PULL_TROUBLE: [&str; 3] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerConfigError",
];
/// Waiting reasons that no wait mends.
const NEVER_STARTS: [&str; 2] = ["InvalidImageName", "ErrImageNeverPull"];

/// What one pod says of its replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodView {
    /// Not started; with the reason it cannot start, if Kubernetes gave one that a wait may
    /// mend (an image pull backing off).
    Waiting(Option<String>),
    Running,
    Ended(JobExit),
}

/// Read a pod's status.
pub fn pod_view(pod: &Pod) -> PodView {
    let status = pod.status.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let container: Option<ContainerStatus> = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == CONTAINER);
    let state = container.as_ref().and_then(|c| c.state.clone());
    let terminated = state.as_ref().and_then(|s| s.terminated.clone());
    let message = |m: Option<String>| m.filter(|m| !m.is_empty()).map(|m| format!(": {m}"));
    match status.phase.as_deref() {
        Some("Succeeded") => return PodView::Ended(JobExit::Exited(0)),
        Some("Failed") => {
            if status.reason.as_deref() == Some("Evicted") {
                return PodView::Ended(JobExit::Failed(format!(
                    "pod {name} was evicted{}",
                    message(status.message).unwrap_or_default()
                )));
            }
            if let Some(t) = terminated {
                if t.reason.as_deref() == Some("OOMKilled") {
                    return PodView::Ended(JobExit::Failed(format!(
                        "OOMKilled: pod {name} ran out of memory (its limit is the trial's \
                         resources.memory; exit code {})",
                        t.exit_code
                    )));
                }
                return PodView::Ended(JobExit::Exited(if t.exit_code == 0 {
                    1
                } else {
                    t.exit_code
                }));
            }
            // Failed without its container ending: the node, the kubelet or a controller
            // ended it (node shutdown, a deadline, an admission error).
            let disruption = status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "DisruptionTarget" && c.status == "True");
            let why = match (status.reason, disruption) {
                (Some(reason), _) => {
                    format!("{reason}{}", message(status.message).unwrap_or_default())
                }
                (None, Some(c)) => format!(
                    "{}{}",
                    c.reason.unwrap_or_else(|| "disrupted".into()),
                    message(c.message).unwrap_or_default()
                ),
                (None, None) => "failed without a reason".to_string(),
            };
            return PodView::Ended(JobExit::Lost(format!("pod {name}: {why}")));
        }
        Some("Unknown") => {
            return PodView::Ended(JobExit::Lost(format!(
                "pod {name}: its node stopped reporting{}",
                message(status.reason).unwrap_or_default()
            )));
        }
        _ => {}
    }
    if let Some(t) = terminated {
        // The container ended, the pod's phase not yet updated: the container decides.
        return PodView::Ended(if t.exit_code == 0 {
            JobExit::Exited(0)
        } else if t.reason.as_deref() == Some("OOMKilled") {
            JobExit::Failed(format!(
                "OOMKilled: pod {name} ran out of memory (its limit is the trial's \
                 resources.memory; exit code {})",
                t.exit_code
            ))
        } else {
            JobExit::Exited(t.exit_code)
        });
    }
    if let Some(waiting) = state.as_ref().and_then(|s| s.waiting.clone()) {
        let reason = waiting.reason.clone().unwrap_or_default();
        let image = container.and_then(|c| Some(c.image).filter(|i| !i.is_empty()));
        let what = format!(
            "{reason}{}{}",
            image.map(|i| format!(" ({i})")).unwrap_or_default(),
            message(waiting.message).unwrap_or_default()
        );
        if NEVER_STARTS.contains(&reason.as_str()) {
            return PodView::Ended(JobExit::Failed(format!("pod {name} cannot start: {what}")));
        }
        if PULL_TROUBLE.contains(&reason.as_str()) {
            return PodView::Waiting(Some(what));
        }
        return PodView::Waiting(None);
    }
    if state.as_ref().is_some_and(|s| s.running.is_some()) {
        return PodView::Running;
    }
    PodView::Waiting(None)
}

/// The replica a pod runs: its pool by the Job that owns it (one of this attempt's, by uid,
/// so that a deleted attempt's pods never count), its index by the completion index.
pub fn replica_of(pod: &Pod, jobs: &BTreeMap<String, usize>) -> Option<ReplicaId> {
    let pool = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find_map(|o| jobs.get(&o.uid))?;
    let index = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(COMPLETION_INDEX))
        .or_else(|| pod.metadata.labels.as_ref()?.get(COMPLETION_INDEX))?
        .parse()
        .ok()?;
    Some(ReplicaId { pool: *pool, index })
}

struct Seen {
    replica: ReplicaId,
    ended: bool,
    /// Since when its image cannot be pulled, and why.
    pulling: Option<(Instant, String)>,
}

/// An attempt's state as the watch has shown it so far.
pub struct Tracker {
    /// This attempt's Jobs: uid → pool.
    jobs: BTreeMap<String, usize>,
    pods: BTreeMap<String, Seen>,
    pull_timeout: Duration,
    decided: Option<JobExit>,
}

impl Tracker {
    pub fn new(jobs: BTreeMap<String, usize>, pull_timeout: Duration) -> Self {
        Self {
            jobs,
            pods: BTreeMap::new(),
            pull_timeout,
            decided: None,
        }
    }

    /// The attempt's Jobs, once they exist: uid → pool.
    pub fn set_jobs(&mut self, jobs: BTreeMap<String, usize>) {
        self.jobs = jobs;
    }

    pub fn decided(&self) -> Option<&JobExit> {
        self.decided.as_ref()
    }

    pub fn replica_of(&self, pod: &Pod) -> Option<ReplicaId> {
        replica_of(pod, &self.jobs)
    }

    /// The first decisive event wins: what follows it (the other pods stopped) is its effect.
    fn decide(&mut self, replica: ReplicaId, exit: JobExit) {
        if self.decided.is_some() {
            return;
        }
        if replica.is_primary() {
            self.decided = Some(exit);
        } else if !exit.success() {
            // A worker that finished its part before the primary is no failure.
            self.decided = Some(JobExit::ReplicaFailed {
                replica: replica.name(),
                exit: Box::new(exit),
            });
        }
    }

    /// A pod was added or changed.
    pub fn pod(&mut self, pod: &Pod, now: Instant) {
        let (Some(replica), Some(name)) = (self.replica_of(pod), pod.metadata.name.clone()) else {
            return;
        };
        let seen = self.pods.entry(name).or_insert(Seen {
            replica,
            ended: false,
            pulling: None,
        });
        match pod_view(pod) {
            PodView::Ended(exit) => {
                seen.ended = true;
                seen.pulling = None;
                self.decide(replica, exit);
            }
            PodView::Waiting(Some(why)) => {
                let since = seen.pulling.as_ref().map_or(now, |(t, _)| *t);
                seen.pulling = Some((since, why));
                self.tick(now);
            }
            PodView::Waiting(None) | PodView::Running => seen.pulling = None,
        }
    }

    /// A pod is gone. One that had not ended was lost with its node, or deleted by someone.
    pub fn pod_deleted(&mut self, pod: &Pod) {
        let Some(replica) = self.replica_of(pod) else {
            return;
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ended = self.pods.get(&name).is_some_and(|s| s.ended);
        self.pods.remove(&name);
        if !ended {
            // Its last state may say why (an eviction, an OOM kill) before it vanished.
            if let PodView::Ended(exit) = pod_view(pod) {
                return self.decide(replica, exit);
            }
            self.decide(
                replica,
                JobExit::Lost(format!(
                    "pod {name} vanished before it ended (its node was lost, or it was \
                     deleted or preempted)"
                )),
            );
        }
    }

    /// A Job changed: one past its `activeDeadlineSeconds` ends the attempt.
    pub fn job(&mut self, job: &Job) {
        let failed = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Failed" && c.status == "True");
        if let Some(c) = failed
            && c.reason.as_deref() == Some("DeadlineExceeded")
        {
            let deadline = job
                .spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .map(|s| format!(" ({s} s, the trial's timeout_secs)"))
                .unwrap_or_default();
            let name = job.metadata.name.clone().unwrap_or_default();
            self.decide(
                ReplicaId::PRIMARY,
                JobExit::Failed(format!("Job {name} exceeded its active deadline{deadline}")),
            );
        }
    }

    /// A Job of the attempt was deleted, not by Augur.
    pub fn job_deleted(&mut self, job: &Job) {
        let name = job.metadata.name.clone().unwrap_or_default();
        self.decide(
            ReplicaId::PRIMARY,
            JobExit::Lost(format!("Job {name} was deleted")),
        );
    }

    /// Fail the attempt when a pod has waited for its image longer than allowed.
    pub fn tick(&mut self, now: Instant) {
        let stuck = self.pods.values().find_map(|s| {
            let (since, why) = s.pulling.as_ref()?;
            (now.duration_since(*since) >= self.pull_timeout).then(|| (s.replica, why.clone()))
        });
        if let Some((replica, why)) = stuck {
            let secs = self.pull_timeout.as_secs();
            self.decide(
                replica,
                JobExit::Failed(format!(
                    "the image could not be pulled within {secs} s \
                     (image_pull_timeout_secs): {why}"
                )),
            );
        }
    }

    /// When the next image-pull wait runs out, if a pod is waiting.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.pods
            .values()
            .filter_map(|s| s.pulling.as_ref().map(|(t, _)| *t + self.pull_timeout))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, pool: usize, index: usize, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "annotations": {COMPLETION_INDEX: index.to_string()},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "j",
                                     "uid": format!("uid-{pool}"), "controller": true}],
            },
            "status": status,
        }))
        .expect("pod")
    }

    fn terminated(code: i32, reason: &str) -> serde_json::Value {
        json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
               "containerStatuses": [{"name": CONTAINER, "image": "i", "imageID": "", "ready": false,
                   "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason}}}]})
    }

    fn tracker() -> Tracker {
        Tracker::new(
            [("uid-0".to_string(), 0), ("uid-1".to_string(), 1)].into(),
            Duration::from_secs(300),
        )
    }

    #[test]
    fn the_primary_decides_and_an_early_worker_success_is_no_failure() {
        let mut t = tracker();
        let now = Instant::now();
        t.pod(&pod("w", 1, 0, terminated(0, "Completed")), now);
        assert_eq!(t.decided(), None);
        t.pod(&pod("p", 0, 0, terminated(0, "Completed")), now);
        assert_eq!(t.decided(), Some(&JobExit::Exited(0)));
    }

    #[test]
    fn a_failing_worker_fails_the_attempt_and_what_follows_does_not_change_it() {
        let mut t = tracker();
        let now = Instant::now();
        t.pod(&pod("w", 1, 1, terminated(3, "Error")), now);
        t.pod_deleted(&pod("p", 0, 0, json!({"phase": "Running"})));
        assert_eq!(
            t.decided(),
            Some(&JobExit::ReplicaFailed {
                replica: "workerpool1-1".into(),
                exit: Box::new(JobExit::Exited(3))
            })
        );
    }

    #[test]
    fn oom_kills_evictions_and_vanished_pods_say_what_happened() {
        let mut t = tracker();
        t.pod(
            &pod("p", 0, 0, terminated(137, "OOMKilled")),
            Instant::now(),
        );
        assert!(matches!(t.decided(), Some(JobExit::Failed(why)) if why.starts_with("OOMKilled")));
        let evicted = pod(
            "p",
            0,
            0,
            json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"}),
        );
        assert!(
            matches!(pod_view(&evicted), PodView::Ended(JobExit::Failed(why)) if why.contains("evicted: low on memory"))
        );
        let mut t = tracker();
        t.pod(&pod("p", 0, 0, json!({"phase": "Running"})), Instant::now());
        t.pod_deleted(&pod("p", 0, 0, json!({"phase": "Running"})));
        assert!(matches!(t.decided(), Some(JobExit::Lost(why)) if why.contains("vanished")));
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_after_the_bounded_wait() {
        let mut t = tracker();
        let start = Instant::now();
        let waiting = json!({"phase": "Pending", "containerStatuses": [{"name": CONTAINER, "image": "nope:1",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}]});
        t.pod(&pod("p", 0, 0, waiting.clone()), start);
        t.pod(&pod("p", 0, 0, waiting), start + Duration::from_secs(100));
        assert_eq!(t.decided(), None);
        assert_eq!(t.next_deadline(), Some(start + Duration::from_secs(300)));
        t.tick(start + Duration::from_secs(300));
        assert!(
            matches!(t.decided(), Some(JobExit::Failed(why)) if why.contains("ImagePullBackOff (nope:1): not found"))
        );
    }

    #[test]
    fn pods_of_other_jobs_are_ignored() {
        let mut t = tracker();
        t.pod(&pod("old", 3, 0, terminated(1, "Error")), Instant::now());
        assert_eq!(t.decided(), None);
    }
}
