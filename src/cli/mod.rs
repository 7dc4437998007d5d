//! The `augur` command line. `serve`, `migrate` and `token` work on the database directly;
//! everything else is a thin client of the HTTP API.

mod client;
mod csv;
mod duration;
mod error;
mod exec;
mod lease;
mod pool_worker;
mod reaper;
mod run;
mod server;
mod study;
mod tensorboard;
mod validate;
mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::model::{Role, StudyId, TrialId};

use client::Client;
pub use error::{CliError, CliResult};

const DEFAULT_DATABASE_URL: &str = "sqlite://augur.db";

#[derive(Debug, Parser)]
#[command(
    name = "augur",
    version,
    about = "Self-hosted hyperparameter tuning service"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// The Augur server.
    #[arg(
        long,
        env = "AUGUR_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub url: String,
    /// Bearer token for the server.
    #[arg(long, env = "AUGUR_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Trust this PEM certificate (an https server's own, or its CA) besides the system's.
    #[arg(long, env = "AUGUR_CA_CERT", global = true)]
    pub ca_cert: Option<PathBuf>,
}

/// Where the kubernetes executor runs trials (`trial_job.executor: kubernetes`).
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Namespace of trials whose spec names none (default: the kubeconfig context's, the
    /// service account's in a cluster, or `default`).
    #[arg(long, env = "AUGUR_KUBERNETES_NAMESPACE")]
    pub kubernetes_namespace: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster account).
    #[arg(long, env = "AUGUR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig to use (default: its current context).
    #[arg(long, env = "AUGUR_KUBE_CONTEXT")]
    pub kube_context: Option<String>,
}

/// Where on Kubernetes a spec may place its pods: without these, only an admin's token may
/// name a service account, a namespace or a volume claim.
#[derive(Debug, clap::Args)]
pub struct KubePolicyArgs {
    /// Service accounts a spec may give its pods (repeatable, or comma-separated).
    #[arg(
        long = "kubernetes-service-accounts",
        env = "AUGUR_KUBERNETES_SERVICE_ACCOUNTS",
        value_delimiter = ','
    )]
    pub service_accounts: Vec<String>,
    /// Namespaces a spec may run its pods in (repeatable, or comma-separated).
    #[arg(
        long = "kubernetes-namespaces",
        env = "AUGUR_KUBERNETES_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,
    /// PersistentVolumeClaims a spec may mount as its output volume (repeatable, or
    /// comma-separated).
    #[arg(
        long = "kubernetes-claims",
        env = "AUGUR_KUBERNETES_CLAIMS",
        value_delimiter = ','
    )]
    pub claims: Vec<String>,
    /// The server's own service account, which no trial may use (deploy/ sets it from the
    /// pod's spec.serviceAccountName).
    #[arg(
        long = "kubernetes-own-service-account",
        env = "AUGUR_KUBERNETES_OWN_SERVICE_ACCOUNT"
    )]
    pub own_service_account: Option<String>,
}

impl KubePolicyArgs {
    fn policy(self) -> crate::service::KubernetesPolicy {
        crate::service::KubernetesPolicy {
            service_accounts: self.service_accounts,
            namespaces: self.namespaces,
            claims: self.claims,
            own_service_account: self.own_service_account,
        }
    }
}

impl KubeArgs {
    fn settings(self) -> crate::dispatch::kubernetes::KubeSettings {
        crate::dispatch::kubernetes::KubeSettings {
            namespace: self.kubernetes_namespace,
            kubeconfig: self.kubeconfig,
            context: self.kube_context,
        }
    }
}

/// Webhooks (`serve` and `run`): the server's default, and the hosts webhooks may reach.
#[derive(Debug, Clone, clap::Args)]
pub struct NotifyArgs {
    /// Call this webhook (http or https) for every study that names no `notifications` of
    /// its own: a signed JSON POST with a Slack-compatible `text`.
    #[arg(long, env = "AUGUR_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// The events --notify-url is called for (comma-separated): study_completed,
    /// study_failed, trial_failed, best_improved. Default: all.
    #[arg(long, env = "AUGUR_NOTIFY_EVENTS", value_delimiter = ',')]
    pub notify_events: Vec<String>,
    /// A file holding the secret that signs --notify-url's bodies (HMAC-SHA256 in
    /// X-Augur-Signature); its surrounding whitespace is ignored.
    #[arg(long, env = "AUGUR_NOTIFY_SECRET_FILE")]
    pub notify_secret_file: Option<PathBuf>,
    /// Hosts webhooks may reach although they are (or resolve to) loopback, link-local or
    /// unspecified addresses, refused otherwise (comma-separated names or addresses as a
    /// URL writes them, e.g. 127.0.0.1,hooks.internal).
    #[arg(long, env = "AUGUR_NOTIFY_ALLOW_HOSTS", value_delimiter = ',')]
    pub notify_allow_hosts: Vec<String>,
}

impl NotifyArgs {
    /// The server's webhook settings; the secret read from its file.
    fn config(self) -> Result<crate::app::NotifyConfig, CliError> {
        let secret = match &self.notify_secret_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| CliError::file(path, e))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        Ok(crate::app::NotifyConfig {
            url: self.notify_url,
            events: self.notify_events,
            secret,
            allow_hosts: self.notify_allow_hosts,
            ..Default::default()
        })
    }
}

/// `augur serve`'s options (boxed in [`Command`]: there are many).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// sqlite://PATH (the default, created if missing) or postgres://USER:PASS@HOST/DB.
    #[arg(long, env = "AUGUR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
    #[arg(long, env = "AUGUR_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Accept this bearer token (stored hashed), an admin's: at least 16 characters.
    /// Without any token the server only runs on a loopback address, open.
    #[arg(long, env = "AUGUR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = crate::app::DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// The URL dispatched jobs report to (AUGUR_URL in their environment).
    #[arg(long, env = "AUGUR_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Do not run `trial_job` studies in this process (an API-only replica).
    #[arg(long)]
    pub no_dispatch: bool,
    /// Pass this variable of the server's environment on to every dispatched job
    /// (repeatable, or comma-separated). Jobs otherwise see only PATH, HOME, USER,
    /// LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TMPDIR, TERM of it.
    #[arg(long = "job-env", env = "AUGUR_JOB_ENV", value_delimiter = ',')]
    pub job_env: Vec<String>,
    #[command(flatten)]
    pub executors: ExecutorArgs,
    /// Run only `trial_job` commands that start with one of these (repeatable, or
    /// comma-separated): whole arguments (`/usr/bin/python3 /opt/t/train.py`) or a
    /// directory ending in `/` (`/opt/trainers/`). Default: any command (of operators and
    /// admins).
    #[arg(
        long = "job-commands",
        env = "AUGUR_JOB_COMMANDS",
        value_delimiter = ','
    )]
    pub job_commands: Vec<String>,
    /// Run only container and kubernetes `trial_job`s whose image starts with one of
    /// these (repeatable, or comma-separated), e.g. `registry.example.com/ml/`. With
    /// either this or --job-commands set, a job of the other kind needs its own list.
    #[arg(long = "job-images", env = "AUGUR_JOB_IMAGES", value_delimiter = ',')]
    pub job_images: Vec<String>,
    /// While --job-commands is set, a spec's `env` may set only variables known to load no
    /// code (PYTHONUNBUFFERED, OMP_NUM_THREADS, …) and these (repeatable, or
    /// comma-separated; `PREFIX*` for a family, e.g. `WANDB_*`).
    #[arg(
        long = "job-env-allow",
        env = "AUGUR_JOB_ENV_ALLOW",
        value_delimiter = ','
    )]
    pub job_env_allow: Vec<String>,
    #[command(flatten)]
    pub kubernetes_policy: KubePolicyArgs,
    /// Serve HTTPS with this PEM certificate chain (with --tls-key).
    #[arg(long, env = "AUGUR_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "AUGUR_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Requests a second each token may send (bursts of twice that); past it, 429 with
    /// Retry-After. Default: no limit.
    #[arg(long, env = "AUGUR_RATE_LIMIT")]
    pub rate_limit: Option<f64>,
    /// Seconds a client may take to send a request's head, from its first byte.
    #[arg(long, default_value_t = crate::app::DEFAULT_HEADER_READ_TIMEOUT.as_secs())]
    pub header_read_timeout: u64,
    /// Seconds a connection may go with no byte moving before it is closed (also how long
    /// a connection waits for a request).
    #[arg(long, default_value_t = crate::app::DEFAULT_IDLE_TIMEOUT.as_secs())]
    pub idle_timeout: u64,
    /// Connections open at once; past this, new ones are answered 503.
    #[arg(long, default_value_t = crate::app::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Run local trial jobs as this user (the server must run as root to switch), so
    /// that a trial cannot read the database file or the server's own files.
    #[arg(long, env = "AUGUR_RUN_JOBS_AS")]
    pub run_jobs_as: Option<String>,
    /// The URL the other replicas on this database reach this one at (e.g.
    /// http://10.0.0.7:8080). With it, the changes of a study whose requests overlap are
    /// sent to one live replica, so that they share its commits; any replica still serves
    /// any request.
    #[arg(long, env = "AUGUR_REPLICA_URL")]
    pub replica_url: Option<String>,
    /// Transactions this process commits at once (1 to 8; default one per core, at least
    /// 2). Each commits every change queued meanwhile, of any study. Replicas sharing one
    /// machine (or a small PostgreSQL) commit fewer, larger batches with their cores'
    /// worth split between them (docs/scaling.md).
    #[arg(long, env = "AUGUR_COMMIT_LANES", value_parser = clap::value_parser!(u8).range(1..=8))]
    pub commit_lanes: Option<u8>,
    /// Also serve Optuna's gRPC storage here (e.g. 127.0.0.1:13000), for
    /// `optuna.storages.GrpcStorageProxy(host=…, port=…)`: its studies are Augur studies.
    /// Plain gRPC (no TLS); tokens as for the REST API, in `authorization` metadata.
    #[arg(long, env = "AUGUR_OPTUNA_GRPC_LISTEN")]
    pub optuna_grpc_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub notify: NotifyArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the API server.
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit (`serve` also applies them on start).
    Migrate {
        #[arg(long, env = "AUGUR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// API tokens with roles (on the database, like `serve`).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// The audit trail: who created, changed, stopped or deleted studies, added or excluded
    /// trials, created or revoked tokens (through the HTTP API, with an admin's token).
    Audit {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Studies (through the HTTP API).
    Study {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: StudyCommand,
    },
    /// Run a study on this machine: an embedded server (SQLite), the local executor, a
    /// progress bar; prints the best trial. Run it again to resume.
    Run {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[arg(long, env = "AUGUR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
        /// Pass this variable of the environment on to every trial (as `serve --job-env`).
        #[arg(long = "job-env", env = "AUGUR_JOB_ENV", value_delimiter = ',')]
        job_env: Vec<String>,
        #[command(flatten)]
        executors: ExecutorArgs,
        #[command(flatten)]
        notify: NotifyArgs,
    },
    /// Keep N trials of a study running on this machine (pulled through the API), or, with
    /// --pool, N trials of whichever studies a named worker pool serves.
    Worker(Box<WorkerArgs>),
    /// Trials (through the HTTP API).
    Trial {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: TrialCommand,
    },
    /// TensorBoard over a dispatched study's trials (runs `trial-<id>`, kept current as
    /// trials start), on a machine that sees the trials' directories; the dashboard links
    /// to it while it runs.
    Tensorboard {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        args: tensorboard::TensorboardArgs,
    },
    /// Print the OpenAPI document the server serves.
    Openapi,
    /// (Internal) `augur worker`'s watch over one trial: kills the trial's processes if the
    /// worker dies (see `cli/reaper.rs`).
    #[command(hide = true)]
    ReapTrial {
        handle_file: std::path::PathBuf,
        study_id: StudyId,
        trial_id: TrialId,
    },
}

/// `augur worker`'s arguments.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The study's id, or its name (the one active study of that name).
    #[arg(long, required_unless_present = "pool", conflicts_with = "pool")]
    pub study: Option<String>,
    /// Join this worker pool (created by its first worker or study) and run the trials
    /// of every study whose trial_job says `executor: pool, pool: NAME`, with their own
    /// commands, under this worker's --job-commands / --job-images (an operator's
    /// token). No command after `--`.
    #[arg(long)]
    pub pool: Option<String>,
    /// With --pool: run only trial commands that start with one of these (repeatable,
    /// or comma-separated; as `augur serve --job-commands`). Default: any.
    #[arg(long = "job-commands", value_delimiter = ',', requires = "pool")]
    pub job_commands: Vec<String>,
    /// With --pool: run only images that start with one of these (as `augur serve
    /// --job-images`).
    #[arg(long = "job-images", value_delimiter = ',', requires = "pool")]
    pub job_images: Vec<String>,
    /// With --pool and --job-commands: variables a study's env may set besides those
    /// that load no code (as `augur serve --job-env-allow`).
    #[arg(long = "job-env-allow", value_delimiter = ',', requires = "pool")]
    pub job_env_allow: Vec<String>,
    /// Trials run at once.
    #[arg(long, default_value_t = 1)]
    pub slots: usize,
    /// Stable id: a worker restarted with the same id resumes its unfinished trials.
    #[arg(long, env = "AUGUR_WORKER_ID")]
    pub client_id: Option<String>,
    /// Base of the per-trial directories (default ./augur-runs/study-<id>).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Give trials this variable: `NAME=VALUE`, or `NAME` to pass on this worker's own
    /// (repeatable). Trials otherwise see only PATH, HOME, USER, LOGNAME, SHELL, LANG,
    /// LANGUAGE, LC_*, TZ, TMPDIR, TERM of the worker's environment, never its token.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    #[command(flatten)]
    pub executors: ExecutorArgs,
    /// The training command; values are appended as --<id>=<value> (not with --pool:
    /// a pool runs each study's own command).
    #[arg(last = true, required_unless_present = "pool", conflicts_with = "pool")]
    pub command: Vec<String>,
}

/// The operator's settings for the executors of this machine, the same for `serve`, `run`
/// and `worker`: its GPUs, the container engine, the Kubernetes cluster, Slurm's options.
#[derive(Debug, clap::Args)]
pub struct ExecutorArgs {
    /// The GPUs local replicas may be given, e.g. `0,1,2,3` (each replica asking for N gets N
    /// of its own); default: those `nvidia-smi -L` lists.
    #[arg(long, env = "AUGUR_GPUS", value_delimiter = ',')]
    gpus: Option<Vec<String>>,
    #[command(flatten)]
    containers: ContainerArgs,
    #[command(flatten)]
    kubernetes: KubeArgs,
    /// An `sbatch` option for every Slurm job (repeatable), e.g. `--account=ml`: options a
    /// spec may not pass itself (files, users, environment) are the operator's.
    #[arg(long = "slurm-arg", allow_hyphen_values = true)]
    slurm_args: Vec<String>,
}

impl ExecutorArgs {
    /// The settings as one value, for every executor's context.
    pub fn settings(self) -> crate::dispatch::settings::ExecutorSettings {
        crate::dispatch::settings::ExecutorSettings {
            gpus: self.gpus,
            containers: self.containers.engine(),
            kubernetes: self.kubernetes.settings(),
            slurm_args: self.slurm_args,
        }
    }
}

/// How the container executor runs images: the operator's choice, never a spec's.
#[derive(Debug, clap::Args)]
pub struct ContainerArgs {
    /// `podman` or `docker` (default: podman when installed).
    #[arg(long = "container-engine", env = "AUGUR_CONTAINER_ENGINE")]
    engine: Option<String>,
    /// An option of the engine itself, before `run` (repeatable), e.g. `--runtime=runc`.
    #[arg(long = "container-engine-arg", allow_hyphen_values = true)]
    engine_args: Vec<String>,
    /// An option of every `run` (repeatable), e.g. `--ulimit=nofile=4096:4096`.
    #[arg(long = "container-run-arg", allow_hyphen_values = true)]
    run_args: Vec<String>,
}

impl ContainerArgs {
    fn engine(self) -> crate::dispatch::container::ContainerEngine {
        let mut engine = crate::dispatch::container::ContainerEngine::default();
        if let Some(program) = self.engine {
            engine.program = program;
        }
        engine.global_args = self.engine_args;
        engine.run_args = self.run_args;
        engine
    }
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token with a role, print it once, store only its hash.
    Create {
        #[arg(long)]
        name: String,
        /// reader (every GET, the dashboard), writer (also ask/tell studies, suggest, report,
        /// change its own studies), operator (also `trial_job` studies: commands on this
        /// server's machines), admin (also tokens, the audit trail, every study).
        #[arg(long)]
        role: Role,
        /// Refuse the token after this long: `30d`, `12h`, `90m`, `3600s` (or seconds).
        #[arg(long, value_parser = duration::parse_duration)]
        expires_in: Option<std::time::Duration>,
        #[arg(long, env = "AUGUR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// List tokens: name, role, created, expires, last used (never the secrets).
    List {
        #[arg(long, env = "AUGUR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// Revoke a token. A running server refuses it within 5 s (at once when revoked through
    /// its API, `DELETE /v1/tokens/{name}`).
    Revoke {
        name: String,
        #[arg(long, env = "AUGUR_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TrialCommand {
    /// Show one trial as the API returns it (parameters, measurements, reasons).
    Show { study: StudyId, trial: TrialId },
    /// Run a failed trial again, with the same parameters and directories.
    Retry { study: StudyId, trial: TrialId },
    /// Print a dispatched trial's stdout and stderr.
    Logs {
        study: StudyId,
        trial: TrialId,
        /// Only the last this many bytes.
        #[arg(long)]
        tail_bytes: Option<u64>,
        /// A replica of a cluster trial, e.g. `workerpool1-2` (default: the primary).
        #[arg(long)]
        replica: Option<String>,
    },
    /// Run a command in a running trial's replica, through the server: its stdout and
    /// stderr, and its exit status as this command's (Ctrl-C is passed on as SIGINT). The
    /// study's creator or an admin; trials this server's dispatcher runs.
    Exec {
        study: StudyId,
        trial: TrialId,
        /// A replica of a cluster trial, e.g. `workerpool1-0` (default: the primary).
        #[arg(long)]
        replica: Option<String>,
        /// The command and its arguments (not through a shell).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// An interactive shell in a running trial's replica (a terminal: resized with this
    /// one, Ctrl-C passed through), bash when it has one, sh otherwise.
    Shell {
        study: StudyId,
        trial: TrialId,
        /// A replica of a cluster trial, e.g. `workerpool1-0` (default: the primary).
        #[arg(long)]
        replica: Option<String>,
        /// Run this instead of the shell (on the terminal all the same).
        #[arg(last = true)]
        command: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// One row per trial: id, state, parameters, final metrics.
    Csv,
    /// Every trial as the API returns it.
    Json,
    /// The study's spec as a Vertex AI `HyperparameterTuningJob` (REST JSON).
    Vertex,
}

#[derive(Debug, Subcommand)]
pub enum StudyCommand {
    /// Create a study from a YAML or JSON spec file.
    Create {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Check the file and show the stored spec and the first trials' command lines, as
        /// `study validate`: create nothing, start nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Check a spec file on this machine and show the spec as it would be stored (defaults
    /// filled in) and the first trials' command lines; creates and starts nothing.
    Validate {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
    },
    /// List studies.
    List,
    /// Show a study with its trial counts and best trial.
    Show { id: StudyId },
    /// List a study's trials: id, state, final metrics (or why it failed), parameters.
    Trials {
        id: StudyId,
        /// Every trial as the API returns it, one JSON array.
        #[arg(long)]
        json: bool,
    },
    /// The best trial (or the Pareto set), with its model directory.
    Best {
        id: StudyId,
        /// The API's answer as it is.
        #[arg(long)]
        json: bool,
    },
    /// Delete a study with its trials (its trial directories stay on disk).
    Delete { id: StudyId },
    /// Export all trials (csv, json), or the spec as a Vertex AI job (vertex).
    Export {
        id: StudyId,
        #[arg(long, value_enum, default_value = "csv")]
        format: ExportFormat,
    },
    /// Stop a study.
    Stop { id: StudyId },
    /// Run a failed study again (raise max_failed_trials or max_trials first if it says so).
    Resume { id: StudyId },
}

/// Why `augur` ends with a non-zero status.
#[derive(Debug)]
pub enum Failure {
    /// Printed to stderr; status 1.
    Error(CliError),
    /// Ctrl-C before the work was done: status 130, as a shell reports SIGINT, so that a
    /// script's `augur run … && next-step` does not go on with an unfinished study.
    Interrupted,
    /// `augur trial exec`'s command ended with this status: the same.
    Status(u8),
}

impl From<CliError> for Failure {
    fn from(e: CliError) -> Self {
        Failure::Error(e)
    }
}

/// Run a parsed command; errors come back as one line for the user.
pub async fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Serve(args) => Ok(server::serve((*args).into_config()?).await?),
        Command::Migrate { database_url } => Ok(server::migrate(&database_url).await?),
        Command::Token { command } => Ok(server::token_command(command).await?),
        Command::Audit { client } => Ok(study::print_audit(&client.client()?).await?),
        Command::Run {
            file,
            database_url,
            job_env,
            executors,
            notify,
        } => {
            let run = run::RunOptions {
                job_env,
                executors: executors.settings(),
                notify: notify.config()?,
            };
            match run::run_study_file(&file, &database_url, run).await? {
                run::RunEnd::Finished => Ok(()),
                run::RunEnd::Interrupted => Err(Failure::Interrupted),
            }
        }
        Command::Worker(args) => run_worker_command(*args).await,
        Command::Trial {
            client,
            command:
                TrialCommand::Exec {
                    study,
                    trial,
                    replica,
                    command,
                },
        } => session(&client, study, trial, replica, command, false).await,
        Command::Trial {
            client,
            command:
                TrialCommand::Shell {
                    study,
                    trial,
                    replica,
                    command,
                },
        } => {
            let command = if command.is_empty() {
                DEFAULT_SHELL.iter().map(|w| w.to_string()).collect()
            } else {
                command
            };
            session(&client, study, trial, replica, command, true).await
        }
        Command::Trial { client, command } => Ok(trial_command(&client.client()?, command).await?),
        Command::Tensorboard { client, args } => {
            Ok(tensorboard::run_tensorboard(&client.client()?, args).await?)
        }
        Command::Openapi => {
            print!("{}", crate::app::openapi_yaml());
            Ok(())
        }
        Command::ReapTrial {
            handle_file,
            study_id,
            trial_id,
        } => {
            reaper::reap_trial(handle_file, study_id, trial_id);
            Ok(())
        }
        Command::Study { client, command } => {
            Ok(study::run_study_command(&client.client()?, command).await?)
        }
    }
}

/// `augur worker`: a study's worker, or a pool's.
async fn run_worker_command(args: WorkerArgs) -> Result<(), Failure> {
    let WorkerArgs {
        client,
        study,
        pool,
        job_commands,
        job_images,
        job_env_allow,
        slots,
        client_id,
        output_dir,
        env,
        executors,
        command,
    } = args;
    // Every call a worker makes is safe to repeat: it rides out outages.
    let http = client.client()?.patient();
    let client_id = client_id.unwrap_or_else(worker::default_client_id);
    if let Some(pool) = pool {
        let options = pool_worker::PoolWorkerOptions {
            pool,
            slots,
            client_id,
            output_dir,
            env,
            executors: executors.settings(),
            job_commands,
            job_images,
            job_env_allow,
        };
        return Ok(pool_worker::run_pool_worker(http, options).await?);
    }
    let study = study.ok_or_else(|| CliError::Usage("give --study or --pool".into()))?;
    let study = study::resolve_study(&http, &study).await?;
    let options = worker::WorkerOptions {
        study_id: study,
        slots,
        client_id,
        output_dir,
        env,
        executors: executors.settings(),
        command,
    };
    Ok(worker::run_worker(http, options).await?)
}

impl ClientArgs {
    /// The HTTP client these options describe.
    fn client(&self) -> Result<Client, CliError> {
        Client::new(&self.url, self.token.as_deref(), self.ca_cert.as_deref())
    }
}

impl ServeArgs {
    /// The server's configuration from `serve`'s options.
    fn into_config(self) -> Result<crate::app::ServerConfig, CliError> {
        let ServeArgs {
            database_url,
            listen,
            token,
            body_limit,
            public_url,
            no_dispatch,
            job_env,
            executors,
            job_commands,
            job_images,
            job_env_allow,
            kubernetes_policy,
            tls_cert,
            tls_key,
            rate_limit,
            header_read_timeout,
            idle_timeout,
            max_connections,
            run_jobs_as,
            replica_url,
            commit_lanes,
            optuna_grpc_listen,
            notify,
        } = self;
        if let Some(token) = &token {
            crate::service::check_configured_token(token).map_err(CliError::from)?;
        }
        let mut config = crate::app::ServerConfig::new(database_url, listen);
        config.executors = executors.settings();
        config.token = token;
        config.body_limit = body_limit;
        config.public_url = public_url;
        config.dispatch = !no_dispatch;
        config.job_env = job_env;
        config.job_commands = job_commands;
        config.job_images = job_images;
        config.job_env_allow = job_env_allow;
        config.kubernetes_policy = kubernetes_policy.policy();
        config.tls = tls_cert
            .zip(tls_key)
            .map(|(cert, key)| crate::app::TlsFiles { cert, key });
        config.rate_limit = rate_limit;
        config.header_read_timeout = std::time::Duration::from_secs(header_read_timeout.max(1));
        config.idle_timeout = std::time::Duration::from_secs(idle_timeout.max(1));
        config.max_connections = max_connections.max(1);
        config.run_jobs_as = run_jobs_as;
        config.replica_url = replica_url;
        config.commit_lanes = commit_lanes.map(usize::from);
        config.optuna_grpc_listen = optuna_grpc_listen;
        config.notify = notify.config()?;
        Ok(config)
    }
}

/// What `augur trial shell` runs: bash when the replica has it, sh otherwise.
const DEFAULT_SHELL: [&str; 3] = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi",
];

/// `augur trial exec` and `shell`: the command's status is this process's.
async fn session(
    client: &ClientArgs,
    study: StudyId,
    trial: TrialId,
    replica: Option<String>,
    command: Vec<String>,
    tty: bool,
) -> Result<(), Failure> {
    let options = exec::ExecOptions {
        url: &client.url,
        token: client.token.as_deref(),
        ca_cert: client.ca_cert.as_deref(),
        study,
        trial,
        replica,
        command,
        tty,
    };
    match exec::run_exec(options).await? {
        0 => Ok(()),
        code => Err(Failure::Status(code.clamp(1, 255) as u8)),
    }
}

async fn trial_command(http: &Client, command: TrialCommand) -> CliResult<()> {
    match command {
        // Sessions need the client's settings, not its HTTP client (`session`).
        TrialCommand::Exec { .. } | TrialCommand::Shell { .. } => Err(CliError::Usage(
            "exec and shell run through `augur trial`'s session".into(),
        )),
        TrialCommand::Retry { study, trial } => {
            let path = format!("/v1/studies/{study}/trials/{trial}/retry");
            let t = http.call(reqwest::Method::POST, &path, None).await?;
            println!(
                "trial {trial} of study {study} is {}",
                t["state"].as_str().unwrap_or("?")
            );
            Ok(())
        }
        TrialCommand::Show { study, trial } => {
            let path = format!("/v1/studies/{study}/trials/{trial}");
            let t = http.call(reqwest::Method::GET, &path, None).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&t).unwrap_or_else(|_| t.to_string())
            );
            Ok(())
        }
        TrialCommand::Logs {
            study,
            trial,
            tail_bytes,
            replica,
        } => {
            let mut query: Vec<String> = tail_bytes
                .map(|n| format!("tail_bytes={n}"))
                .into_iter()
                .collect();
            if let Some(r) = replica {
                let r: String = form_urlencoded::byte_serialize(r.as_bytes()).collect();
                query.push(format!("replica={r}"));
            }
            let query = if query.is_empty() {
                String::new()
            } else {
                format!("?{}", query.join("&"))
            };
            let path = format!("/v1/studies/{study}/trials/{trial}/logs{query}");
            let text = http.call(reqwest::Method::GET, &path, None).await?;
            print!("{}", text.as_str().unwrap_or_default());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_with(lanes: &str) -> Result<Option<u8>, String> {
        let cli = Cli::try_parse_from(["augur", "serve", "--commit-lanes", lanes])
            .map_err(|e| e.to_string())?;
        match cli.command {
            Command::Serve(args) => Ok(args.commit_lanes),
            other => Err(format!("parsed as {other:?}")),
        }
    }

    /// `serve`, `run` and `worker` share one group of executor options, passed on as one
    /// value.
    #[test]
    fn serve_run_and_worker_take_the_same_executor_options() {
        let options = [
            "--gpus",
            "0,1",
            "--container-engine",
            "docker",
            "--container-engine-arg=--root=/srv/c",
            "--container-run-arg=--ulimit=nofile=64:64",
            "--kube-context",
            "lab",
            "--slurm-arg=--account=ml",
        ];
        let commands: [&[&str]; 3] = [
            &["augur", "serve"],
            &["augur", "run", "-f", "study.yaml"],
            &["augur", "worker", "--study", "1"],
        ];
        for command in commands {
            let mut argv: Vec<&str> = command.to_vec();
            argv.extend(options);
            if command[1] == "worker" {
                argv.extend(["--", "python3", "train.py"]);
            }
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let settings = match cli.command {
                Command::Serve(args) => args.executors.settings(),
                Command::Run { executors, .. } => executors.settings(),
                Command::Worker(args) => args.executors.settings(),
                other => panic!("parsed as {other:?}"),
            };
            assert_eq!(settings.gpus, Some(vec!["0".to_string(), "1".to_string()]));
            assert_eq!(settings.containers.program, "docker");
            assert_eq!(settings.containers.global_args, ["--root=/srv/c"]);
            assert_eq!(settings.containers.run_args, ["--ulimit=nofile=64:64"]);
            assert_eq!(settings.kubernetes.context.as_deref(), Some("lab"));
            assert_eq!(settings.slurm_args, ["--account=ml"]);
        }
    }

    #[test]
    fn commit_lanes_take_one_to_eight_and_name_the_flag_otherwise() {
        assert_eq!(serve_with("1"), Ok(Some(1)));
        assert_eq!(serve_with("8"), Ok(Some(8)));
        for bad in ["0", "9", "two"] {
            let error = serve_with(bad).expect_err(bad);
            assert!(error.contains("--commit-lanes"), "{bad}: {error}");
        }
    }
}
