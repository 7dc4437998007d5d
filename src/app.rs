//! Wiring: open the store and the service over it, decide whether auth is open, put the API's
//! and the dashboard's routes together, start the dispatcher, bind, serve until shut down.
//! The one place besides `service` that knows the store exists.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::api::{self, AppState};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::service::{Service, ServiceError};
use crate::store;

/// Request bodies larger than this are refused with 413 unless configured otherwise.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
/// How long a client may take to send a request's head, from its first byte: a
/// slow-headers client is cut off. (A connection waiting for a request is closed after
/// [`DEFAULT_IDLE_TIMEOUT`].)
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection on which no byte moves for this long is closed: longer than any request
/// may take (requests time out at 60 s), and than the 90 s for which common HTTP clients
/// (reqwest, Go) keep an idle connection, so that the client lets it go first instead of
/// sending on it as the server closes it.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Connections open at once, all clients together.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "augur".to_string())
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `sqlite://augur.db` (default), `sqlite::memory:`, or `postgres://…`.
    pub database_url: String,
    pub listen: SocketAddr,
    /// An admin token to accept, stored hashed under the name `env` (e.g. from AUGUR_TOKEN).
    pub token: Option<String>,
    pub body_limit: usize,
    /// Run the trials of studies with a `trial_job` in this process (default true).
    pub dispatch: bool,
    /// The URL dispatched jobs report to (`AUGUR_URL`); default `http://<listen address>`,
    /// with 127.0.0.1 for an unspecified address.
    pub public_url: Option<String>,
    /// Where relative `output_dir`s resolve (default: the current directory).
    pub base_dir: Option<std::path::PathBuf>,
    /// Names of this process's environment variables passed on to every dispatched job.
    pub job_env: Vec<String>,
    /// The operator's settings for the executors: GPUs, the container engine, the
    /// Kubernetes cluster, Slurm's options.
    pub executors: crate::dispatch::settings::ExecutorSettings,
    /// Commands a `trial_job` may run (`--job-commands`); empty: any.
    pub job_commands: Vec<String>,
    /// Images a container or kubernetes `trial_job` may run (`--job-images`); empty: any
    /// while `job_commands` is empty too, none otherwise.
    pub job_images: Vec<String>,
    /// Variables (or `PREFIX*`) a spec's `env` may set while `job_commands` is in force,
    /// besides those that load no code (`--job-env-allow`).
    pub job_env_allow: Vec<String>,
    /// Where on Kubernetes a spec may place its pods (`--kubernetes-service-accounts`, …).
    pub kubernetes_policy: crate::service::KubernetesPolicy,
    /// A request's head must arrive within this (also how long a connection may wait for
    /// its next request).
    pub header_read_timeout: std::time::Duration,
    /// A connection on which nothing moves for this long is closed.
    pub idle_timeout: std::time::Duration,
    /// Connections open at once; past this, new ones are answered 503.
    pub max_connections: usize,
    /// Requests a second each token may send (`--rate-limit`); `None`: no limit.
    pub rate_limit: Option<f64>,
    /// Serve HTTPS with this PEM certificate chain and private key.
    pub tls: Option<TlsFiles>,
    /// Run local jobs as this user (`--run-jobs-as`), not the server's.
    pub run_jobs_as: Option<String>,
    /// The URL the other replicas on this database reach this one at (`--replica-url`):
    /// with it, each study's changes go to one replica (`api/forward.rs`).
    pub replica_url: Option<String>,
    /// Commit lanes (`--commit-lanes`, 1 to 8): transactions this process commits at once.
    /// `None`: one per core, at least 2.
    pub commit_lanes: Option<usize>,
    /// Where to serve Optuna's gRPC storage (`--optuna-grpc-listen`); `None`: not served.
    pub optuna_grpc_listen: Option<SocketAddr>,
    /// Webhooks: the server's default and the hosts they may reach (`--notify-*`).
    pub notify: NotifyConfig,
}

/// The operator's webhook settings (`--notify-url`, `--notify-events`,
/// `--notify-secret-file`, `--notify-allow-hosts`), checked by `App::build`.
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// Called for every study that names no webhook of its own.
    pub url: Option<String>,
    /// The events the default webhook is called for; empty: all.
    pub events: Vec<String>,
    /// Signs the default webhook's bodies.
    pub secret: Option<String>,
    /// Hosts webhooks may reach even on loopback, link-local or unspecified addresses.
    pub allow_hosts: Vec<String>,
    /// Attempts per call, the first included.
    pub attempts: u32,
    /// The wait before the second attempt (doubling after each).
    pub first_backoff: Duration,
    /// One attempt's limit.
    pub timeout: Duration,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        let defaults = crate::service::NotifySettings::default();
        Self {
            url: None,
            events: Vec::new(),
            secret: None,
            allow_hosts: Vec::new(),
            attempts: defaults.attempts,
            first_backoff: defaults.first_backoff,
            timeout: defaults.timeout,
        }
    }
}

impl NotifyConfig {
    /// The service's settings, or what is wrong, naming the flag.
    fn settings(&self) -> Result<crate::service::NotifySettings, AppError> {
        use crate::model::{NotificationEvent, NotificationSpec, NotifyHosts};
        let hosts = NotifyHosts::allowing(self.allow_hosts.iter().cloned());
        let default = match &self.url {
            None => None,
            Some(url) => {
                let events = if self.events.is_empty() {
                    NotificationEvent::ALL.to_vec()
                } else {
                    self.events
                        .iter()
                        .map(|e| {
                            NotificationEvent::parse(e.trim()).ok_or_else(|| {
                                AppError::Notify(format!(
                                    "--notify-events: {e:?} is none of study_completed, \
                                     study_failed, trial_failed, best_improved"
                                ))
                            })
                        })
                        .collect::<Result<_, _>>()?
                };
                let spec = NotificationSpec {
                    url: url.clone(),
                    events,
                    secret: self.secret.clone(),
                };
                let target = spec.validate("notify").map_err(|e| {
                    let flag = match e.field.rsplit('.').next() {
                        Some("url") => "--notify-url",
                        Some("secret") => "--notify-secret-file",
                        _ => "--notify-events",
                    };
                    AppError::Notify(format!("{flag}: {}", e.message))
                })?;
                hosts
                    .check_url(&target.url, "--notify-url")
                    .map_err(|e| AppError::Notify(e.to_string()))?;
                Some(target)
            }
        };
        Ok(crate::service::NotifySettings {
            default,
            hosts,
            attempts: self.attempts.max(1),
            first_backoff: self.first_backoff,
            timeout: self.timeout,
        })
    }
}

/// `--tls-cert` and `--tls-key`.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl ServerConfig {
    pub fn new(database_url: impl Into<String>, listen: SocketAddr) -> Self {
        Self {
            database_url: database_url.into(),
            listen,
            token: None,
            body_limit: DEFAULT_BODY_LIMIT,
            dispatch: true,
            public_url: None,
            base_dir: None,
            job_env: Vec::new(),
            executors: Default::default(),
            job_commands: Vec::new(),
            job_images: Vec::new(),
            job_env_allow: Vec::new(),
            kubernetes_policy: Default::default(),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            rate_limit: None,
            tls: None,
            run_jobs_as: None,
            replica_url: None,
            commit_lanes: None,
            optuna_grpc_listen: None,
            notify: NotifyConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "refusing to serve on {0} without a token: set AUGUR_TOKEN (or --token), or create one with `augur token create`; only a loopback address may run open"
    )]
    OpenOnNetwork(SocketAddr),
    #[error(transparent)]
    Tls(#[from] crate::serve::TlsError),
    #[error(transparent)]
    RunAs(#[from] crate::dispatch::local::RunAsError),
    #[error("--replica-url: {0}")]
    ReplicaUrl(String),
    #[error("--replica-url: {0}")]
    Forwarder(#[from] api::forward::ForwarderError),
    #[error("{0}")]
    JobPolicy(String),
    #[error("{0}")]
    Notify(String),
    #[error("server error: {0}")]
    Serve(#[from] std::io::Error),
}

/// A bound, ready server.
pub struct App {
    addr: SocketAddr,
    listener: TcpListener,
    router: axum::Router,
    limits: crate::serve::ConnectionLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    service: Service,
    dispatcher: Option<Dispatcher>,
    replicas: Option<std::sync::Arc<crate::service::Replicas>>,
    /// Optuna's gRPC storage: its listener and the state its calls are checked with.
    optuna: Option<(TcpListener, AppState)>,
    pub open: bool,
}

/// The service over the configured database, with the server's job policy, webhooks and
/// configured token.
async fn configured_service(
    config: &ServerConfig,
    base_dir: std::path::PathBuf,
) -> Result<Service, AppError> {
    let mut service = open_service(&config.database_url, base_dir).await?;
    if let Some(lanes) = config.commit_lanes {
        service = service.with_commit_lanes(lanes);
    }
    let policy =
        crate::service::JobPolicy::new(config.job_commands.clone(), config.job_images.clone())
            .and_then(|p| {
                p.with_env_allow(config.job_env_allow.clone())
                    .with_kubernetes(config.kubernetes_policy.clone())
            })
            .map_err(AppError::JobPolicy)?;
    for warning in policy.warnings() {
        tracing::warn!("{warning}");
    }
    let service = service
        .with_job_policy(policy)
        .with_notify_settings(config.notify.settings()?);
    // The webhooks' HTTP client asks for the process's TLS provider.
    crate::serve::install_tls_provider();
    service.start_notifications().map_err(AppError::Notify)?;
    if let Some(token) = &config.token {
        service.register_configured_token(token).await?;
    }
    Ok(service)
}

/// Join the replicas as `replica_id`, reached at `url` (`--replica-url`): the live set, and
/// the forwarder that sends a study's changes on to its owner.
async fn join_replicas(
    config: &ServerConfig,
    service: &Service,
    replica_id: &str,
    url: &str,
) -> Result<
    (
        std::sync::Arc<crate::service::Replicas>,
        api::forward::Forwarder,
    ),
    AppError,
> {
    let parsed = url::Url::parse(url).map_err(|e| AppError::ReplicaUrl(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(AppError::ReplicaUrl(format!(
            "{url} is not an http(s) URL with a host"
        )));
    }
    let replicas = service
        .join_replicas(
            replica_id.to_string(),
            url.trim_end_matches('/').to_string(),
        )
        .await?;
    let trust = config.tls.as_ref().map(|files| files.cert.as_path());
    let forwarder = api::forward::Forwarder::new(replicas.clone(), config.body_limit, trust)?;
    Ok((replicas, forwarder))
}

impl App {
    /// Open the store (applying migrations), register the configured token, bind.
    pub async fn build(config: ServerConfig) -> Result<App, AppError> {
        let base_dir = match config.base_dir.clone() {
            Some(dir) => dir,
            None => std::env::current_dir()?,
        };
        let service = configured_service(&config, base_dir.clone()).await?;
        let open = !service.has_api_tokens().await?;
        if open && !config.listen.ip().is_loopback() {
            return Err(AppError::OpenOnNetwork(config.listen));
        }
        if let Some(addr) = config.optuna_grpc_listen
            && open
            && !addr.ip().is_loopback()
        {
            return Err(AppError::OpenOnNetwork(addr));
        }
        let run_as = match &config.run_jobs_as {
            Some(name) => Some(crate::dispatch::local::RunAs::lookup(name)?),
            None => None,
        };
        let tls = match &config.tls {
            Some(files) => Some(crate::serve::tls_acceptor(&files.cert, &files.key)?),
            None => None,
        };
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| AppError::Bind {
                addr: config.listen,
                source,
            })?;
        let addr = listener.local_addr()?;
        let public_url = config.public_url.clone().unwrap_or_else(|| {
            let host = if addr.ip().is_unspecified() {
                "127.0.0.1".to_string()
            } else {
                addr.ip().to_string()
            };
            let scheme = if tls.is_some() { "https" } else { "http" };
            format!("{scheme}://{host}:{}", addr.port())
        });
        // One name for this process among the replicas and the dispatchers.
        let replica_id = format!(
            "{}-{}-{:08x}",
            hostname(),
            std::process::id(),
            rand::random::<u32>()
        );
        let (replicas, forwarder) = match &config.replica_url {
            Some(url) => {
                let (replicas, forwarder) =
                    join_replicas(&config, &service, &replica_id, url).await?;
                (Some(replicas), Some(forwarder))
            }
            None => (None, None),
        };
        let (router, access) = routes();
        let state = AppState::new(service.clone(), open, public_url.clone(), openapi_yaml())
            .with_rate_limit(config.rate_limit)
            .with_tls(tls.is_some())
            .with_forwarder(forwarder)
            .with_access(access);
        let optuna = match config.optuna_grpc_listen {
            Some(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|source| AppError::Bind { addr, source })?;
                Some((listener, state.clone()))
            }
            None => None,
        };
        let router = api::serve_layers(router.split_for_parts().0, state, config.body_limit);
        let dispatcher = config.dispatch.then(|| {
            let dispatch_config = DispatchConfig {
                augur_url: public_url,
                base_dir,
                owner: replica_id,
                job_env: config.job_env.clone(),
                executors: config.executors.clone(),
                run_as,
            };
            let dispatcher = Dispatcher::new(service.clone(), dispatch_config);
            service.set_trial_exec(dispatcher.trial_exec());
            dispatcher
        });
        Ok(App {
            addr,
            listener,
            router,
            limits: crate::serve::ConnectionLimits {
                header_read_timeout: config.header_read_timeout,
                idle_timeout: config.idle_timeout,
                max_connections: config.max_connections,
            },
            tls,
            service,
            dispatcher,
            replicas,
            optuna,
            open,
        })
    }

    /// Where Optuna's gRPC storage is served, if it is.
    pub fn optuna_addr(&self) -> Option<SocketAddr> {
        self.optuna
            .as_ref()
            .and_then(|(listener, _)| listener.local_addr().ok())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn service(&self) -> &Service {
        &self.service
    }

    /// Serve until Ctrl-C / SIGTERM, finishing requests in flight; then stop dispatched
    /// jobs, leaving their trials to be resumed by the next start.
    pub async fn run(self) -> Result<(), AppError> {
        self.run_until(shutdown_signal()).await
    }

    /// Serve until `stop` resolves.
    pub async fn run_until(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), AppError> {
        let dispatching = self.dispatcher.as_ref().map(|d| (d.clone(), d.spawn()));
        let renewal = self.replicas.as_ref().map(|r| r.spawn_renewal());
        let replicas = self.replicas.clone();
        // Optuna's storage stops with the REST API.
        let (stopping, stopped) = tokio::sync::watch::channel(false);
        let optuna = self.optuna.map(|(listener, state)| {
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let stop = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                if let Err(e) = api::optuna::serve(listener, state, stop).await {
                    tracing::error!(error = %e, "Optuna's gRPC storage stopped");
                }
            })
        });
        // Leave the replicas before the last requests drain: the others stop routing here.
        let stop = async move {
            stop.await;
            let _ = stopping.send(true);
            if let Some(renewal) = renewal {
                renewal.abort();
            }
            if let Some(replicas) = replicas {
                replicas.leave().await;
            }
        };
        let served =
            crate::serve::serve(self.listener, self.router, self.limits, self.tls, stop).await;
        if let Some((dispatcher, task)) = dispatching {
            dispatcher.shutdown().await;
            let _ = task.await;
        }
        if let Some(task) = optuna {
            let _ = task.await;
        }
        served?;
        Ok(())
    }
}

/// Open the store a URL names (applying its migrations) and the service over it; for the
/// server and for the commands that work on the database directly (`migrate`, `token`).
pub async fn open_service(
    database_url: &str,
    runs_base: std::path::PathBuf,
) -> Result<Service, AppError> {
    let store = store::connect(database_url).await?;
    Ok(Service::new(store, runs_base))
}

/// Every route: the API's and the dashboard's, with their OpenAPI document and who may
/// call each.
fn routes() -> (
    utoipa_axum::router::OpenApiRouter<AppState>,
    api::access::AccessTable,
) {
    api::routes().merge(crate::dashboard::router()).into_parts()
}

/// Who may call each route the server has (`api::access`).
pub fn access_table() -> api::access::AccessTable {
    routes().1
}

/// The OpenAPI document the server serves, as YAML.
pub fn openapi_yaml() -> String {
    let (_, doc) = routes().0.split_for_parts();
    doc.to_yaml()
        .unwrap_or_else(|e| format!("# could not render the OpenAPI document: {e}\n"))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = terminate => {} }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_default_webhook_is_refused_naming_its_flag() {
        let config = |url: &str, events: &[&str], allow: &[&str]| NotifyConfig {
            url: Some(url.into()),
            events: events.iter().map(|e| e.to_string()).collect(),
            allow_hosts: allow.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        };
        let refused = |c: NotifyConfig| c.settings().err().map(|e| e.to_string());
        let loopback = refused(config("http://127.0.0.1:9/", &[], &[]));
        assert!(loopback.is_some_and(|e| e.starts_with("--notify-url")));
        let scheme = refused(config("ftp://example.com/", &[], &[]));
        assert!(scheme.is_some_and(|e| e.starts_with("--notify-url")));
        let event = refused(config("https://example.com/", &["trial_done"], &[]));
        assert!(event.is_some_and(|e| e.starts_with("--notify-events")));
        let allowed = config("http://127.0.0.1:9/", &["study_failed"], &["127.0.0.1"]);
        let settings = allowed.settings().expect("allowed");
        assert!(settings.default.is_some_and(|d| d.events.len() == 1));
    }
}
