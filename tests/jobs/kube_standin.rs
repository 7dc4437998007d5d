//! A stand-in for the Kubernetes API server, in this process, for the kubernetes executor's
//! tests (no API server can run on this machine). An axum app that holds Jobs, Pods, Services
//! and Secrets in one namespace map and speaks enough of the API for the real `kube` client:
//! create (409 for a taken name), get, list and delete (label selectors with `=`, `!=`,
//! existence), JSON merge patch, `?watch=true` streams of ADDED/MODIFIED/DELETED events with
//! resource versions (replayed from any version given), and pod logs (`follow=true` streams
//! until the container ends). A tiny Job controller makes an Indexed Job's pods (hostname,
//! completion-index annotation and label, owner reference), fails a Job whose pod fails
//! (`backoffLimit: 0`: its other pods are deleted) and completes one whose pods all succeeded;
//! deletes cascade to dependents (by owner uid) and record their propagation policy. The tests
//! play the kubelet: they make pods run, print, succeed, fail, get OOM-killed, fail to pull
//! their image, get evicted, or vanish; and they read a container's environment as the
//! kubelet would resolve it (downward-API annotations, Secret keys, `$(VAR)` expansion).
//!
//! `exec` into a running pod runs the command as a process of this machine (there is no
//! container) with the container's environment as `container_env` resolves it, over the
//! channel protocol (`v5.channel.k8s.io`, or v4): stdin on channel 0 (closed by `255 0` on
//! v5), stdout 1, stderr 2, the final `Status` on 3 (`NonZeroExitCode` with its `ExitCode`
//! cause).
//!
//! Not modelled: a terminal in `exec` (`tty=true` is refused) and its resizes, the image's
//! files, user and working directory in `exec`; scheduling (a pod runs when a test says, but never while it has a scheduling
//! gate), real DNS and networking, the kubelet and container runtimes, admission (no
//! validation: the manifests are checked against the official schemas separately), RBAC and
//! authentication (any bearer token is accepted), quotas and limit ranges, field selectors,
//! pagination, bookmarks, strategic-merge semantics (patches are merged as JSON merge patches),
//! finalizers and graceful termination (a deleted object is gone at once), events, and any
//! kind of object besides these four.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// The kinds of object the stand-in holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Job,
    Pod,
    Service,
    Secret,
}

impl Kind {
    fn of_resource(resource: &str) -> Option<Kind> {
        match resource {
            "jobs" => Some(Kind::Job),
            "pods" => Some(Kind::Pod),
            "services" => Some(Kind::Service),
            "secrets" => Some(Kind::Secret),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Job => "Job",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::Secret => "Secret",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::Job => "batch/v1",
            _ => "v1",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::Job => "jobs",
            Kind::Pod => "pods",
            Kind::Service => "services",
            Kind::Secret => "secrets",
        }
    }
}

type Key = (Kind, String, String);

#[derive(Debug, Clone)]
struct WatchEntry {
    rv: u64,
    kind: Kind,
    namespace: String,
    kind_of_event: &'static str,
    object: Value,
}

/// A pod's log: its lines and whether the container has ended.
#[derive(Default)]
struct PodLog {
    lines: Vec<String>,
    closed: bool,
}

/// One deletion as the client asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    pub kind: Kind,
    pub name: String,
    /// `propagationPolicy` of the request (`None`: not given; cascades are `Some("cascade")`).
    pub propagation: Option<String>,
}

#[derive(Default)]
struct Store {
    rv: u64,
    uids: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<WatchEntry>,
    logs: BTreeMap<(String, String), PodLog>,
    deletions: Vec<Deletion>,
    /// Requests by method and path, for the tests' assertions.
    requests: Vec<(Method, String)>,
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    events: broadcast::Sender<WatchEntry>,
    /// Bumped whenever a log grows or closes.
    log_tick: Arc<watch::Sender<u64>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn object(&self, kind: Kind, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .iter()
            .find(|((k, _, n), _)| *k == kind && n == name)
            .map(|(_, v)| v.clone())
    }

    /// The environment of a pod's container as the kubelet resolves it: plain values with
    /// `$(VAR)` expanded (and `$$` read as `$`), downward-API annotations, Secret keys.
    /// Panics on a reference that cannot be resolved (the container would not start).
    fn container_env(&self, pod: &str) -> BTreeMap<String, String> {
        let object = self.object(Kind::Pod, pod).expect("pod");
        let mut env = BTreeMap::new();
        let vars = object["spec"]["containers"][0]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for var in vars {
            let name = var["name"].as_str().expect("env name").to_string();
            let value = if let Some(value) = var["value"].as_str() {
                expand(value, &env)
            } else if let Some(path) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                let key = path
                    .strip_prefix("metadata.annotations['")
                    .and_then(|k| k.strip_suffix("']"))
                    .unwrap_or_else(|| panic!("unsupported fieldRef {path}"));
                object["metadata"]["annotations"][key]
                    .as_str()
                    .unwrap_or_else(|| panic!("{pod}: no annotation {key} for {name}"))
                    .to_string()
            } else if let Some(secret) = var["valueFrom"]["secretKeyRef"]["name"].as_str() {
                let key = var["valueFrom"]["secretKeyRef"]["key"]
                    .as_str()
                    .expect("key");
                let secret = self
                    .object(Kind::Secret, secret)
                    .unwrap_or_else(|| panic!("{pod}: no Secret {secret}"));
                secret["stringData"][key]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| panic!("{pod}: no key {key} in the Secret"))
            } else {
                panic!("{pod}: unsupported env source for {name}: {var}");
            };
            env.insert(name, value);
        }
        env
    }
}

/// The running stand-in.
pub struct StandIn {
    pub addr: SocketAddr,
    shared: Shared,
    dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    pub async fn start() -> StandIn {
        let shared = Shared {
            store: Arc::default(),
            events: broadcast::channel(4096).0,
            log_tick: Arc::new(watch::channel(0).0),
        };
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods/{name}/log", get(pod_log))
            .route("/api/v1/namespaces/{ns}/pods/{name}/exec", get(pod_exec))
            .route(
                "/api/v1/namespaces/{ns}/{resource}",
                get(list_or_watch).post(create),
            )
            .route(
                "/api/v1/namespaces/{ns}/{resource}/{name}",
                get(read).patch(patch).delete(delete),
            )
            .route(
                "/apis/batch/v1/namespaces/{ns}/{resource}",
                get(list_or_watch).post(create),
            )
            .route(
                "/apis/batch/v1/namespaces/{ns}/{resource}/{name}",
                get(read).patch(patch).delete(delete),
            )
            .layer(axum::middleware::from_fn_with_state(shared.clone(), record))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the stand-in");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StandIn {
            addr,
            shared,
            dir: tempfile::tempdir().expect("temp dir"),
            task,
        }
    }

    /// A kubeconfig naming this stand-in, with `namespace` as its context's namespace.
    pub fn kubeconfig(&self, namespace: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{namespace}"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: http://{}\n\
             users:\n- name: tester\n  user:\n    token: standin-token\ncontexts:\n- name: standin\n  context:\n    \
             cluster: standin\n    user: tester\n    namespace: {namespace}\ncurrent-context: standin\n",
            self.addr
        );
        std::fs::write(&path, text).expect("write the kubeconfig");
        path
    }

    fn lock(&self) -> MutexGuard<'_, Store> {
        self.shared.lock()
    }

    /// Every object of a kind, sorted by name.
    pub fn objects(&self, kind: Kind) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((k, _, _), _)| *k == kind)
            .map(|(_, v)| v.clone())
            .collect()
    }

    pub fn names(&self, kind: Kind) -> Vec<String> {
        self.objects(kind)
            .iter()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string))
            .collect()
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .iter()
            .find(|((k, _, n), _)| *k == kind && n == name)
            .map(|(_, v)| v.clone())
    }

    pub fn deletions(&self) -> Vec<Deletion> {
        self.lock().deletions.clone()
    }

    pub fn requests(&self) -> Vec<(Method, String)> {
        self.lock().requests.clone()
    }

    /// The pod of `job` with completion index `index`, if there is one.
    pub fn pod_of(&self, job: &str, index: usize) -> Option<String> {
        self.objects(Kind::Pod)
            .into_iter()
            .find(|p| {
                p["metadata"]["labels"]["batch.kubernetes.io/job-name"] == job
                    && p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
                        .as_str()
                        .and_then(|i| i.parse::<usize>().ok())
                        == Some(index)
            })
            .and_then(|p| p["metadata"]["name"].as_str().map(str::to_string))
    }

    /// Wait for the pod of `job` at `index`.
    pub async fn wait_pod(&self, job: &str, index: usize) -> String {
        for _ in 0..400 {
            if let Some(name) = self.pod_of(job, index) {
                return name;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no pod {job}[{index}]; pods: {:?}", self.names(Kind::Pod));
    }

    /// Wait until `check` holds of the store.
    pub async fn wait_until(&self, what: &str, check: impl Fn(&StandIn) -> bool) {
        for _ in 0..800 {
            if check(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("stand-in: timed out waiting for {what}");
    }

    /// Wait until the pod has no scheduling gate left (Augur lifted it).
    pub async fn wait_ungated(&self, pod: &str) {
        self.wait_until(&format!("{pod} ungated"), |s| {
            s.get(Kind::Pod, pod).is_some_and(|p| {
                p["spec"]["schedulingGates"]
                    .as_array()
                    .is_none_or(|g| g.is_empty())
            })
        })
        .await;
    }

    /// Change a stored object and tell the watchers.
    fn update(&self, kind: Kind, name: &str, change: impl FnOnce(&mut Value)) {
        let mut store = self.lock();
        let Some(key) = store
            .objects
            .keys()
            .find(|(k, _, n)| *k == kind && n == name)
            .cloned()
        else {
            panic!("no {kind:?} {name}");
        };
        let mut object = store.objects[&key].clone();
        change(&mut object);
        store.put(&self.shared.events, key, object, "MODIFIED");
    }

    /// The tests' kubelet, one round: every pod that is ungated and not in `handled` yet,
    /// run ([`Self::run`]) and added to it, with its name.
    pub fn run_new_pods(
        &self,
        handled: &mut std::collections::HashSet<String>,
    ) -> Vec<(String, Value)> {
        let mut started = Vec::new();
        for pod in self.objects(Kind::Pod) {
            let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
            let gated = pod["spec"]["schedulingGates"]
                .as_array()
                .is_some_and(|g| !g.is_empty());
            if gated || !handled.insert(name.clone()) {
                continue;
            }
            self.run(&name);
            started.push((name, pod));
        }
        started
    }

    /// The scheduler and the kubelet: the pod runs. Refused while it is gated, as a real
    /// scheduler would never place it.
    pub fn run(&self, pod: &str) {
        let object = self.get(Kind::Pod, pod).expect("pod");
        assert!(
            object["spec"]["schedulingGates"]
                .as_array()
                .is_none_or(|g| g.is_empty()),
            "pod {pod} is still gated: no scheduler would place it"
        );
        let image = object["spec"]["containers"][0]["image"].clone();
        self.update(Kind::Pod, pod, |p| {
            p["spec"]["nodeName"] = json!("standin-node");
            p["status"] = json!({
                "phase": "Running",
                "podIP": "10.0.0.7",
                "containerStatuses": [{"name": "trainer", "image": image, "imageID": "", "ready": true,
                    "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": "2026-11-30T12:00:00Z"}}}],
            });
        });
    }

    /// The container prints a line (stdout and stderr are one log, as with the kubelet).
    pub fn print(&self, pod: &str, line: &str) {
        let mut store = self.lock();
        store
            .logs
            .entry(("".into(), pod.to_string()))
            .or_default()
            .lines
            .push(line.to_string());
        drop(store);
        self.shared.log_tick.send_modify(|n| *n += 1);
    }

    fn close_log(&self, pod: &str) {
        self.lock()
            .logs
            .entry(("".into(), pod.to_string()))
            .or_default()
            .closed = true;
        self.shared.log_tick.send_modify(|n| *n += 1);
    }

    /// The container exits with `code` (reason `OOMKilled` for an OOM kill).
    pub fn exit(&self, pod: &str, code: i32) {
        self.terminate(pod, code, if code == 0 { "Completed" } else { "Error" });
    }

    pub fn oom_kill(&self, pod: &str) {
        self.terminate(pod, 137, "OOMKilled");
    }

    fn terminate(&self, pod: &str, code: i32, reason: &str) {
        self.close_log(pod);
        self.update(Kind::Pod, pod, |p| {
            let image = p["spec"]["containers"][0]["image"].clone();
            p["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
            p["status"]["containerStatuses"] = json!([{"name": "trainer", "image": image, "imageID": "",
                "ready": false, "restartCount": 0, "started": false,
                "state": {"terminated": {"exitCode": code, "reason": reason,
                    "startedAt": "2026-11-30T12:00:00Z", "finishedAt": "2026-11-30T12:01:00Z"}}}]);
        });
        self.job_controller(pod);
    }

    /// The kubelet cannot pull the pod's image (`ErrImagePull`, then `ImagePullBackOff`).
    pub fn image_pull_fails(&self, pod: &str, reason: &str) {
        self.update(Kind::Pod, pod, |p| {
            let image = p["spec"]["containers"][0]["image"].clone();
            p["status"] = json!({"phase": "Pending", "containerStatuses": [{"name": "trainer",
                "image": image, "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason,
                    "message": format!("Back-off pulling image {image}: not found")}}}]});
        });
    }

    /// The kubelet evicts the pod (node pressure).
    pub fn evict(&self, pod: &str) {
        self.close_log(pod);
        self.update(Kind::Pod, pod, |p| {
            p["status"]["phase"] = json!("Failed");
            p["status"]["reason"] = json!("Evicted");
            p["status"]["message"] = json!("The node was low on resource: memory.");
        });
        self.job_controller(pod);
    }

    /// The pod is gone without an end of its own (its node was lost, someone deleted it).
    pub fn vanish(&self, pod: &str) {
        self.close_log(pod);
        let mut store = self.lock();
        if let Some(key) = store
            .objects
            .keys()
            .find(|(k, _, n)| *k == Kind::Pod && n == pod)
            .cloned()
        {
            store.remove(&self.shared.events, &key);
        }
    }

    /// The Job passed its `activeDeadlineSeconds`: failed, its pods deleted.
    pub fn deadline_exceeded(&self, job: &str) {
        self.update(Kind::Job, job, |j| {
            j["status"]["conditions"] = json!([{"type": "Failed", "status": "True",
                "reason": "DeadlineExceeded", "message": "Job was active longer than specified deadline"}]);
        });
        let uid = self.get(Kind::Job, job).expect("job")["metadata"]["uid"].clone();
        let mut store = self.lock();
        store.remove_dependents(&self.shared.events, &uid, false);
    }

    /// What the Job controller does when one of its pods ends: with `backoffLimit: 0`, a
    /// failed pod fails the Job and its other pods are deleted; all succeeded completes it.
    fn job_controller(&self, pod: &str) {
        let Some(object) = self.get(Kind::Pod, pod) else {
            return;
        };
        let Some(job) = object["metadata"]["labels"]["batch.kubernetes.io/job-name"].as_str()
        else {
            return;
        };
        let Some(job_object) = self.get(Kind::Job, job) else {
            return;
        };
        let uid = job_object["metadata"]["uid"].clone();
        let pods: Vec<Value> = self
            .objects(Kind::Pod)
            .into_iter()
            .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid)
            .collect();
        if object["status"]["phase"] == "Failed" {
            self.update(Kind::Job, job, |j| {
                j["status"]["failed"] = json!(1);
                j["status"]["conditions"] = json!([{"type": "Failed", "status": "True",
                    "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]);
            });
            let mut store = self.lock();
            for p in pods {
                let phase = p["status"]["phase"].as_str().unwrap_or("");
                if phase != "Failed" && phase != "Succeeded" {
                    let name = p["metadata"]["name"].as_str().unwrap_or("").to_string();
                    let key = (Kind::Pod, String::new(), name.clone());
                    let key = store
                        .objects
                        .keys()
                        .find(|(k, _, n)| *k == key.0 && *n == name)
                        .cloned();
                    if let Some(key) = key {
                        store.remove(&self.shared.events, &key);
                    }
                }
            }
        } else if pods.iter().all(|p| p["status"]["phase"] == "Succeeded") {
            self.update(Kind::Job, job, |j| {
                j["status"]["succeeded"] = json!(pods.len());
                j["status"]["conditions"] = json!([{"type": "Complete", "status": "True"}]);
            });
        }
    }

    /// The environment of a pod's container as the kubelet resolves it: plain values with
    /// `$(VAR)` expanded (and `$$` read as `$`), downward-API annotations, Secret keys.
    /// Panics on a reference that cannot be resolved (the container would not start).
    pub fn container_env(&self, pod: &str) -> BTreeMap<String, String> {
        self.shared.container_env(pod)
    }

    /// The container's command and arguments as the kubelet runs them (`$$` read as `$`).
    pub fn container_argv(&self, pod: &str) -> Vec<String> {
        let object = self.get(Kind::Pod, pod).expect("pod");
        let c = &object["spec"]["containers"][0];
        let env = self.container_env(pod);
        c["command"]
            .as_array()
            .into_iter()
            .chain(c["args"].as_array())
            .flatten()
            .filter_map(Value::as_str)
            .map(|w| expand(w, &env))
            .collect()
    }
}

/// The kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is one `$`, anything
/// else is left as written.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('$') => {
                chars.next();
                out.push('$');
            }
            Some('(') => {
                chars.next();
                let name: String = chars.by_ref().take_while(|c| *c != ')').collect();
                match env.get(&name) {
                    Some(v) => out.push_str(v),
                    None => out.push_str(&format!("$({name})")),
                }
            }
            _ => out.push('$'),
        }
    }
    out
}

impl Store {
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn put(
        &mut self,
        events: &broadcast::Sender<WatchEntry>,
        key: Key,
        mut object: Value,
        kind_of_event: &'static str,
    ) {
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let entry = WatchEntry {
            rv,
            kind: key.0,
            namespace: key.1.clone(),
            kind_of_event,
            object: object.clone(),
        };
        self.objects.insert(key, object);
        self.history.push(entry.clone());
        let _ = events.send(entry);
    }

    fn remove(&mut self, events: &broadcast::Sender<WatchEntry>, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        let rv = self.next_rv();
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let entry = WatchEntry {
            rv,
            kind: key.0,
            namespace: key.1.clone(),
            kind_of_event: "DELETED",
            object: object.clone(),
        };
        self.history.push(entry.clone());
        let _ = events.send(entry);
        if key.0 == Kind::Pod {
            self.logs
                .entry((String::new(), key.2.clone()))
                .or_default()
                .closed = true;
        }
        Some(object)
    }

    /// The garbage collector: every object owned by `uid` goes (recorded as a cascade).
    fn remove_dependents(
        &mut self,
        events: &broadcast::Sender<WatchEntry>,
        uid: &Value,
        record: bool,
    ) {
        let owned: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, v)| {
                v["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == *uid))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in owned {
            if record {
                self.deletions.push(Deletion {
                    kind: key.0,
                    name: key.2.clone(),
                    propagation: Some("cascade".into()),
                });
            }
            if let Some(object) = self.remove(events, &key) {
                let uid = object["metadata"]["uid"].clone();
                self.remove_dependents(events, &uid, record);
            }
        }
    }
}

async fn record(
    State(shared): State<Shared>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = match request.uri().query() {
        Some(q) => format!("{}?{q}", request.uri().path()),
        None => request.uri().path().to_string(),
    };
    shared
        .lock()
        .requests
        .push((request.method().clone(), path));
    next.run(request).await
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    (code, axum::Json(body)).into_response()
}

fn not_held(resource: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("the stand-in holds no {resource}"),
    )
}

/// A label selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-separated (all must hold).
fn selects(selector: Option<&str>, object: &Value) -> bool {
    let labels = &object["metadata"]["labels"];
    selector
        .unwrap_or("")
        .split(',')
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                labels[k.trim()].as_str() != Some(v.trim())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                labels[k.trim()].as_str() == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!') {
                labels[k.trim()].is_null()
            } else {
                !labels[term.trim()].is_null()
            }
        })
}

fn with_type(kind: Kind, mut object: Value) -> Value {
    object["apiVersion"] = json!(kind.api_version());
    object["kind"] = json!(kind.name());
    object
}

async fn list_or_watch(
    State(shared): State<Shared>,
    Path((ns, resource)): Path<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let Some(kind) = Kind::of_resource(&resource) else {
        return not_held(&resource);
    };
    let selector = query.get("labelSelector").cloned();
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    if !watching {
        let store = shared.lock();
        let items: Vec<Value> = store
            .objects
            .iter()
            .filter(|((k, n, _), v)| *k == kind && *n == ns && selects(selector.as_deref(), v))
            .map(|(_, v)| with_type(kind, v.clone()))
            .collect();
        let body = json!({"apiVersion": kind.api_version(), "kind": format!("{}List", kind.name()),
            "metadata": {"resourceVersion": store.rv.to_string()}, "items": items});
        return axum::Json(body).into_response();
    }
    let from: u64 = query
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .unwrap_or(300u64);
    // Subscribed before the history is read: no event falls between the two.
    let (mut live, past) = {
        let store = shared.lock();
        let live = shared.events.subscribe();
        let past: Vec<WatchEntry> = store
            .history
            .iter()
            .filter(|e| e.rv > from)
            .cloned()
            .collect();
        (live, past)
    };
    let wanted = move |e: &WatchEntry| {
        e.kind == kind && e.namespace == ns && selects(selector.as_deref(), &e.object)
    };
    let line = move |e: &WatchEntry| -> Result<Bytes, Infallible> {
        let event = json!({"type": e.kind_of_event, "object": with_type(e.kind, e.object.clone())});
        Ok(Bytes::from(format!("{event}\n")))
    };
    let stream = async_stream(move |tx| async move {
        let mut last = from;
        for e in past.iter().filter(|e| wanted(e)) {
            last = e.rv;
            if tx.send(line(e)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
        loop {
            let event = tokio::select! {
                e = live.recv() => e,
                _ = tokio::time::sleep_until(deadline) => return,
            };
            match event {
                Ok(e) if e.rv > last && wanted(&e) => {
                    last = e.rv;
                    if tx.send(line(&e)).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                // Too far behind: end the watch; the client lists again.
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A body stream fed by a task.
fn async_stream<F, Fut>(
    produce: F,
) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(produce(tx));
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn read(
    State(shared): State<Shared>,
    Path((ns, resource, name)): Path<(String, String, String)>,
) -> Response {
    let Some(kind) = Kind::of_resource(&resource) else {
        return not_held(&resource);
    };
    match shared.lock().objects.get(&(kind, ns, name.clone())) {
        Some(v) => axum::Json(with_type(kind, v.clone())).into_response(),
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", kind.plural()),
        ),
    }
}

async fn create(
    State(shared): State<Shared>,
    Path((ns, resource)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let Some(kind) = Kind::of_resource(&resource) else {
        return not_held(&resource);
    };
    let Ok(mut object) = serde_json::from_slice::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    let Some(name) = object["metadata"]["name"].as_str().map(str::to_string) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "no name".into(),
        );
    };
    let mut store = shared.lock();
    let key = (kind, ns.clone(), name.clone());
    if store.objects.contains_key(&key) {
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", kind.plural()),
        );
    }
    store.uids += 1;
    let uid = format!("uid-{}", store.uids);
    object["metadata"]["uid"] = json!(uid);
    object["metadata"]["namespace"] = json!(ns);
    object["metadata"]["creationTimestamp"] = json!("2026-11-30T12:00:00Z");
    if kind == Kind::Secret
        && let Some(data) = object["stringData"].as_object().cloned()
    {
        // The API server keeps `data` (base64); the stand-in keeps both for the tests.
        let encoded: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    json!(base64(v.as_str().unwrap_or("").as_bytes())),
                )
            })
            .collect();
        object["data"] = Value::Object(encoded);
    }
    let object = with_type(kind, object);
    store.put(&shared.events, key, object.clone(), "ADDED");
    if kind == Kind::Job {
        start_pods(&mut store, &shared.events, &ns, &object);
    }
    let stored = store
        .objects
        .get(&(kind, ns, name))
        .cloned()
        .unwrap_or(object);
    (StatusCode::CREATED, axum::Json(stored)).into_response()
}

/// The Job controller's part: an Indexed Job's pods, one per completion index.
fn start_pods(store: &mut Store, events: &broadcast::Sender<WatchEntry>, ns: &str, job: &Value) {
    let name = job["metadata"]["name"].as_str().unwrap_or("").to_string();
    let uid = job["metadata"]["uid"].clone();
    let count = job["spec"]["parallelism"].as_u64().unwrap_or(1);
    let template = &job["spec"]["template"];
    for index in 0..count {
        let mut labels = template["metadata"]["labels"].clone();
        if labels.is_null() {
            labels = json!({});
        }
        labels["batch.kubernetes.io/job-name"] = json!(name);
        labels["job-name"] = json!(name);
        labels["batch.kubernetes.io/controller-uid"] = uid.clone();
        labels["controller-uid"] = uid.clone();
        labels["batch.kubernetes.io/job-completion-index"] = json!(index.to_string());
        let mut annotations = template["metadata"]["annotations"].clone();
        if annotations.is_null() {
            annotations = json!({});
        }
        annotations["batch.kubernetes.io/job-completion-index"] = json!(index.to_string());
        let mut spec = template["spec"].clone();
        spec["hostname"] = json!(format!("{name}-{index}"));
        store.uids += 1;
        let pod_name = format!("{name}-{index}-{:05x}", store.uids);
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": ns, "uid": format!("uid-{}", store.uids),
                "labels": labels, "annotations": annotations,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                    "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": spec,
            "status": {"phase": "Pending"},
        });
        store.put(events, (Kind::Pod, ns.to_string(), pod_name), pod, "ADDED");
    }
}

async fn patch(
    State(shared): State<Shared>,
    Path((ns, resource, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(kind) = Kind::of_resource(&resource) else {
        return not_held(&resource);
    };
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/merge-patch+json") {
        return status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!("the stand-in merges JSON merge patches only, not {content_type}"),
        );
    }
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not JSON".into());
    };
    let mut store = shared.lock();
    let key = (kind, ns, name.clone());
    let Some(mut object) = store.objects.get(&key).cloned() else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", kind.plural()),
        );
    };
    if kind == Kind::Pod {
        // Scheduling gates may only be removed, never added, once a pod exists.
        let before = object["spec"]["schedulingGates"]
            .as_array()
            .map_or(0, Vec::len);
        let after = patch["spec"]["schedulingGates"].as_array().map(Vec::len);
        if after.is_some_and(|n| n > before) {
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                "spec.schedulingGates: only deletion is allowed".into(),
            );
        }
    }
    merge(&mut object, &patch);
    store.put(&shared.events, key.clone(), object, "MODIFIED");
    let stored = store.objects.get(&key).cloned().unwrap_or(Value::Null);
    axum::Json(stored).into_response()
}

/// RFC 7386.
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in fields {
                if v.is_null() {
                    if let Some(t) = target.as_object_mut() {
                        t.remove(k);
                    }
                } else {
                    merge(&mut target[k], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

async fn delete(
    State(shared): State<Shared>,
    Path((ns, resource, name)): Path<(String, String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let Some(kind) = Kind::of_resource(&resource) else {
        return not_held(&resource);
    };
    let options: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let propagation = options["propagationPolicy"]
        .as_str()
        .map(str::to_string)
        .or_else(|| query.get("propagationPolicy").cloned());
    let mut store = shared.lock();
    let key = (kind, ns, name.clone());
    let Some(object) = store.remove(&shared.events, &key) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{} \"{name}\" not found", kind.plural()),
        );
    };
    store.deletions.push(Deletion {
        kind,
        name: name.clone(),
        propagation: propagation.clone(),
    });
    // Background and Foreground take the dependents along; Orphan leaves them (for Jobs the
    // API server's default is Orphan).
    let cascade = match propagation.as_deref() {
        Some("Background" | "Foreground") => true,
        Some(_) => false,
        None => kind != Kind::Job,
    };
    if cascade {
        let uid = object["metadata"]["uid"].clone();
        store.remove_dependents(&shared.events, &uid, true);
    }
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": name, "kind": kind.plural(), "uid": object["metadata"]["uid"]}});
    axum::Json(body).into_response()
}

async fn pod_log(
    State(shared): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let pod = shared
        .lock()
        .objects
        .get(&(Kind::Pod, ns, name.clone()))
        .cloned();
    let Some(pod) = pod else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
        );
    };
    let state = &pod["status"]["containerStatuses"][0]["state"];
    if state["running"].is_null() && state["terminated"].is_null() {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("container \"trainer\" in pod \"{name}\" is waiting to start"),
        );
    }
    let follow = matches!(query.get("follow").map(String::as_str), Some("true" | "1"));
    let mut tick = shared.log_tick.subscribe();
    let stream = async_stream(move |tx| async move {
        let mut sent = 0;
        loop {
            let (lines, closed) = {
                let store = shared.lock();
                match store.logs.get(&(String::new(), name.clone())) {
                    Some(log) => (log.lines[sent..].to_vec(), log.closed),
                    None => (Vec::new(), false),
                }
            };
            for line in lines {
                sent += 1;
                if tx.send(Ok(Bytes::from(format!("{line}\n")))).await.is_err() {
                    return;
                }
            }
            if closed || !follow {
                return;
            }
            // A deleted pod's log closes without a tick: look again now and then.
            let _ = tokio::time::timeout(Duration::from_millis(100), tick.changed()).await;
        }
    });
    Response::builder()
        .header("content-type", "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn base64(bytes: &[u8]) -> String {
    const TABLE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(TABLE[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `GET …/pods/{name}/exec?command=…&stdin=…`: see the module header.
async fn pod_exec(
    State(shared): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
    upgrade: axum::extract::ws::WebSocketUpgrade,
) -> Response {
    let pod = shared
        .lock()
        .objects
        .get(&(Kind::Pod, ns, name.clone()))
        .cloned();
    let Some(pod) = pod else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("pods \"{name}\" not found"),
        );
    };
    if pod["status"]["phase"] != "Running" {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("pod {name} is not running"),
        );
    }
    let pairs: Vec<(String, String)> = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    let command: Vec<String> = pairs
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if pairs.iter().any(|(k, v)| k == "tty" && v == "true") {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the stand-in has no terminals".into(),
        );
    }
    if command.is_empty() {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "no command".into());
    }
    let env = shared.container_env(&name);
    upgrade
        .protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"])
        .on_upgrade(move |socket| run_exec(socket, command, env))
}

/// Run `command` for an `exec` stream (see the module header).
async fn run_exec(
    mut socket: axum::extract::ws::WebSocket,
    command: Vec<String>,
    env: BTreeMap<String, String>,
) {
    use axum::extract::ws::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exit_status = |status: Value| {
        let mut data = vec![3u8];
        data.extend(status.to_string().into_bytes());
        Message::Binary(data.into())
    };
    let spawned = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env_clear()
        .envs(env)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let failure = json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                "message": format!("exec failed: {e}")});
            let _ = socket.send(exit_status(failure)).await;
            return;
        }
    };
    let mut stdin = child.stdin.take();
    let (tx, mut output) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    for (channel, pipe) in [
        (
            1u8,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            2u8,
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(mut pipe) = pipe else { continue };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    return;
                }
                let mut data = vec![channel];
                data.extend_from_slice(&buf[..n]);
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    loop {
        tokio::select! {
            data = output.recv() => match data {
                Some(data) => {
                    if socket.send(Message::Binary(data.into())).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            message = socket.recv() => match message {
                Some(Ok(Message::Binary(data))) => match data.first() {
                    Some(0) => {
                        if let Some(pipe) = stdin.as_mut() {
                            let _ = pipe.write_all(&data[1..]).await;
                            let _ = pipe.flush().await;
                        }
                    }
                    Some(255) if data.get(1) == Some(&0) => stdin = None,
                    _ => {}
                },
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
    let code = child
        .wait()
        .await
        .ok()
        .and_then(|s| s.code())
        .unwrap_or(255);
    let status = if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": format!("command terminated with non-zero exit code: exit code {code}"),
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
    };
    let _ = socket.send(exit_status(status)).await;
    let _ = socket.send(Message::Close(None)).await;
}
