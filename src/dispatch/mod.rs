//! Dispatch: the service runs the trials of studies that have a `trial_job` itself: the
//! [`Dispatcher`] starts one runner per study (exactly one across replicas), which keeps
//! `parallel_trials` trials running on an executor.

mod attempt;
mod checkpoint;
pub mod cluster;
pub mod collect;
pub mod container;
pub mod environment;
pub mod error;
pub mod exec;
pub mod executor;
pub mod gpus;
pub mod handle;
pub mod kubernetes;
pub mod local;
pub mod ports;
pub mod reporter;
pub mod runner;
pub mod settings;
pub mod slurm;
pub mod trial;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

pub use environment::job_base_env;
pub use error::{DispatchError, DispatchResult};

use crate::model::{StudyId, StudyState};
use crate::service::Service;
use executor::ExecutorContext;
use trial::Interrupt;

/// How often the dispatcher looks for studies it should run (it also reacts at once to
/// studies created or changed in this process).
const SCAN_EVERY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// The URL jobs use to reach this server (`AUGUR_URL`).
    pub augur_url: String,
    /// Where relative `output_dir`s and the default output directory live.
    pub base_dir: PathBuf,
    /// Identifies this process in runner leases.
    pub owner: String,
    /// Names of the server's environment variables passed on to every job besides the
    /// inherited ones (`--job-env`), e.g. a shared cache path or an experiment tracker's key.
    pub job_env: Vec<String>,
    /// The operator's settings for the executors (GPUs, engine, cluster, Slurm options).
    pub executors: settings::ExecutorSettings,
    /// Local jobs run as this user (`--run-jobs-as`), not the server's.
    pub run_as: Option<local::RunAs>,
}

/// Starts and stops study runners in this process.
///
/// Dispatch: the service runs the trials of studies that have a `trial_job` itself. The
/// [`Dispatcher`] finds such studies and starts one runner per study (exactly one across
/// replicas, by a lease the service keeps); `runner.rs` keeps `parallel_trials` trials running,
/// `trial.rs` runs one trial through its attempts (`attempt.rs`), with the environment of
/// `environment.rs`, reporting through `reporter.rs`, on an executor (`executor.rs`: `local.rs`,
/// `slurm.rs`, `kubernetes/`). Metrics from stdout and the hypertune file are parsed in `collect.rs`.
/// Everything it knows of studies it asks the service.
#[derive(Clone)]
pub struct Dispatcher {
    service: Service,
    config: Arc<DispatchConfig>,
    /// Shared by every study's executors: the machine's GPUs, the ports clusters hold.
    executors: ExecutorContext,
    runners: Arc<Mutex<HashMap<StudyId, watch::Sender<Interrupt>>>>,
    shutdown: watch::Sender<bool>,
}

impl Dispatcher {
    pub fn new(service: Service, config: DispatchConfig) -> Self {
        Self {
            service,
            executors: ExecutorContext::new(&config.executors, config.run_as.clone()),
            config: Arc::new(config),
            runners: Arc::default(),
            shutdown: watch::channel(false).0,
        }
    }

    /// Opens exec sessions in the trials this dispatcher runs, through its executors.
    pub fn trial_exec(&self) -> std::sync::Arc<exec::DispatchExec> {
        exec::DispatchExec::new(self.executors.clone())
    }

    /// Run until `shutdown` is called: scan for dispatchable studies, start runners.
    pub fn spawn(&self) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move { this.run().await })
    }

    /// Stop every runner, killing their jobs but leaving the trials to be resumed.
    pub async fn shutdown(&self) {
        let _ = self.shutdown.send(true);
        let senders: Vec<watch::Sender<Interrupt>> = match self.runners.lock() {
            Ok(mut map) => map.drain().map(|(_, tx)| tx).collect(),
            Err(_) => Vec::new(),
        };
        for tx in &senders {
            let _ = tx.send(Interrupt::Shutdown);
        }
        for tx in senders {
            tx.closed().await;
        }
    }

    async fn run(self) {
        let mut events = self.service.subscribe();
        let mut shutdown = self.shutdown.subscribe();
        let mut scan = tokio::time::interval(SCAN_EVERY);
        loop {
            tokio::select! {
                _ = scan.tick() => self.scan().await,
                event = events.recv() => match event {
                    Ok(study_id) => self.poke(study_id).await,
                    Err(_) => self.scan().await,
                },
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Start runners for active studies with a trial job that no one runs.
    async fn scan(&self) {
        match self.service.dispatched_study_ids().await {
            Ok(ids) => {
                for id in ids {
                    self.start_runner(id).await;
                }
            }
            Err(error) => tracing::warn!(%error, "dispatcher could not list studies"),
        }
    }

    /// A study was created, changed, stopped or deleted here.
    async fn poke(&self, study_id: StudyId) {
        let running = self
            .runners
            .lock()
            .map(|m| m.get(&study_id).cloned())
            .ok()
            .flatten();
        match running {
            // The runner re-reads its study on every wake-up.
            Some(tx) => tx.send_modify(|_| {}),
            None => {
                if let Ok(Some(study)) = self.service.runner_study(study_id).await
                    && study.state == StudyState::Active
                    && study
                        .config
                        .trial_job
                        .as_ref()
                        .is_some_and(|job| job.executor.pool().is_none())
                {
                    self.start_runner(study_id).await;
                }
            }
        }
    }

    async fn start_runner(&self, study_id: StudyId) {
        let already = self
            .runners
            .lock()
            .map(|m| m.contains_key(&study_id))
            .unwrap_or(true);
        if already {
            return;
        }
        match self
            .service
            .claim_runner(study_id, &self.config.owner)
            .await
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(%study_id, %error, "could not claim study runner");
                return;
            }
        }
        let (tx, rx) = watch::channel(Interrupt::None);
        if let Ok(mut map) = self.runners.lock() {
            map.insert(study_id, tx);
        }
        let this = self.clone();
        tokio::spawn(async move {
            let (service, config) = (this.service.clone(), this.config.clone());
            runner::run_study(service, config, this.executors.clone(), study_id, rx).await;
            if let Ok(mut map) = this.runners.lock() {
                map.remove(&study_id);
            }
            let _ = this
                .service
                .release_runner(study_id, &this.config.owner)
                .await;
        });
    }
}
