//! The container executor (DESIGN §4.2): each replica a container of its `image` on this
//! machine, through Podman or Docker.

use super::handle::JobHandle;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use tokio::process::Command;
use tokio::sync::mpsc;

use super::cluster::Address;
use super::exec::{ExecVia, SessionProcess, refused, refused_replica};
use super::executor::write_private;
use super::executor::{
    Executor, ExecutorContext, ExecutorError, JobRequest, ReplicaRequest, RunningJob,
};
use super::local::{Launch, LocalCluster, loopback_addresses, reserve_machine, spawn_replica};
use crate::model::{ReplicaId, StudyId, TrialId};
use crate::service::exec::{ExecRefused, ExecRequest, ExecTarget};

/// How the server runs containers: the engine's program and the options the operator gives it
/// (`--container-engine`, `--container-engine-arg`, `--container-run-arg`). Never from a
/// study's spec: an engine option (a host mount, `--privileged`) would hand the machine to
/// whoever writes specs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEngine {
    /// `podman` or `docker` (or a path to either).
    pub program: String,
    /// Options before the subcommand (e.g. Podman's `--root`, `--runtime runc`).
    pub global_args: Vec<String>,
    /// Options of every `run` (e.g. `--ulimit nofile=1024:1024`).
    pub run_args: Vec<String>,
}

impl Default for ContainerEngine {
    /// Podman when it is installed, Docker otherwise.
    fn default() -> Self {
        let on_path = |name: &str| {
            std::env::var_os("PATH")
                .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        };
        let program = if on_path("podman") || !on_path("docker") {
            "podman"
        } else {
            "docker"
        };
        ContainerEngine {
            program: program.to_string(),
            global_args: Vec::new(),
            run_args: Vec::new(),
        }
    }
}

/// The label keys of Augur's containers (as its Kubernetes objects).
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=augur";
const STUDY_LABEL: &str = "augur.dev/study";
const TRIAL_LABEL: &str = "augur.dev/trial";
const REPLICA_LABEL: &str = "augur.dev/replica";
/// The trial's directory: tells this trial's containers from those of another server's
/// study with the same ids.
const TRIAL_DIR_LABEL: &str = "augur.dev/trial-dir";

impl ContainerEngine {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.global_args);
        command
    }

    fn is_docker(&self) -> bool {
        Path::new(&self.program)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("docker"))
    }

    /// SIGTERM to each container's process (`--init` passes it on), SIGKILL after `grace`.
    /// One `stop` per container, all at once: Podman refuses a whole list when one of its
    /// containers is already gone (`--rm`).
    pub async fn stop(&self, names: &[String], grace: Duration) {
        let grace = grace.as_secs().max(1).to_string();
        self.each(names, &["stop", "--time", &grace]).await;
    }

    /// Remove the containers (already gone when they ran with `--rm`).
    pub async fn remove(&self, names: &[String]) {
        self.each(names, &["rm", "--force"]).await;
    }

    /// `<engine> <subcommand…> <name>` for every name at once; failures (a container already
    /// gone) are expected and ignored.
    async fn each(&self, names: &[String], subcommand: &[&str]) {
        let mut runs = tokio::task::JoinSet::new();
        for name in names {
            let mut command = self.command();
            command.args(subcommand).arg(name).kill_on_drop(true);
            runs.spawn(async move { command.output().await });
        }
        while runs.join_next().await.is_some() {}
    }

    /// Names of the containers of this trial, running or not, found by their labels.
    async fn labelled(&self, study_id: StudyId, trial_id: TrialId, trial_dir: &str) -> Vec<String> {
        let out = self
            .command()
            .args(["ps", "--all", "--format", "{{.Names}}"])
            .args(["--filter", &format!("label={STUDY_LABEL}={study_id}")])
            .args(["--filter", &format!("label={TRIAL_LABEL}={trial_id}")])
            .args(["--filter", &format!("label={TRIAL_DIR_LABEL}={trial_dir}")])
            .output()
            .await;
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The engine's `exec` of a session's command in container `name`.
    fn exec_argv(&self, name: &str, request: &ExecRequest) -> Vec<String> {
        let mut argv = vec![self.program.clone()];
        argv.extend(self.global_args.iter().cloned());
        argv.extend(["exec".to_string(), "--interactive".to_string()]);
        if request.tty {
            argv.push("--tty".to_string());
        }
        argv.push(name.to_string());
        argv.extend(request.command.iter().cloned());
        argv
    }

    /// The engine's `run` for one replica, attached (its output is the replica's).
    fn run_argv(&self, run: &ContainerRun<'_>) -> Vec<String> {
        let mut argv = vec![self.program.clone()];
        argv.extend(self.global_args.iter().cloned());
        argv.extend(
            [
                "run",
                "--rm",
                "--init",
                "--network=host",
                "--name",
                run.name,
                "--label",
                MANAGED_BY,
            ]
            .map(str::to_string),
        );
        for (key, value) in [
            (STUDY_LABEL, run.study_id.to_string()),
            (TRIAL_LABEL, run.trial_id.to_string()),
            (REPLICA_LABEL, run.replica.id.name()),
            (TRIAL_DIR_LABEL, run.trial_dir.display().to_string()),
        ] {
            argv.extend(["--label".to_string(), format!("{key}={value}")]);
        }
        argv.extend(["--env-file".to_string(), run.env_file.display().to_string()]);
        let mount = run.trial_dir.display().to_string();
        argv.extend(["--volume".to_string(), format!("{mount}:{mount}")]);
        if let Some(dir) = run.workdir {
            argv.extend(["--workdir".to_string(), dir.display().to_string()]);
        }
        if let Some((uid, gid)) = run.user {
            argv.extend(["--user".to_string(), format!("{uid}:{gid}")]);
        }
        let resources = &run.replica.resources;
        if let Some(cpu) = resources.cpu {
            argv.extend(["--cpus".to_string(), cpu.to_string()]);
        }
        if let Some(bytes) = resources.memory_bytes() {
            argv.extend(["--memory".to_string(), format!("{bytes}b")]);
        }
        if !run.gpus.is_empty() {
            if self.is_docker() {
                argv.extend([
                    "--gpus".to_string(),
                    format!("\"device={}\"", run.gpus.join(",")),
                ]);
            } else {
                // Podman reaches NVIDIA devices through CDI (nvidia-ctk cdi generate).
                for gpu in run.gpus {
                    argv.extend(["--device".to_string(), format!("nvidia.com/gpu={gpu}")]);
                }
            }
        }
        argv.extend(self.run_args.iter().cloned());
        // The engine's options end here: whatever the image's text, it is not one.
        argv.push("--".to_string());
        argv.push(run.image.to_string());
        argv.extend(run.replica.argv.iter().cloned());
        argv
    }
}

/// Everything one replica's `run` names.
struct ContainerRun<'a> {
    name: &'a str,
    study_id: StudyId,
    trial_id: TrialId,
    replica: &'a ReplicaRequest,
    image: &'a str,
    env_file: &'a Path,
    trial_dir: &'a Path,
    workdir: Option<&'a Path>,
    gpus: &'a [String],
    /// `--run-jobs-as`: the container's processes run as this uid and gid.
    user: Option<(u32, u32)>,
}

/// A container's name: study, trial, attempt and replica, and this launch's `nonce` (two
/// servers on one machine, each with its own database, may both run a study 1).
fn container_name(request: &JobRequest, replica: ReplicaId, nonce: &str) -> String {
    format!(
        "augur-s{}-t{}-a{}-{}-{nonce}",
        request.study_id,
        request.trial_id,
        request.attempt,
        replica.name()
    )
}

/// `KEY=VALUE` lines for `--env-file`, which takes each value to the end of its line.
fn env_file_text(env: &[(String, String)]) -> Result<String, ExecutorError> {
    let mut text = String::new();
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\n']) || v.contains('\n') {
            return Err(ExecutorError::Launch(format!(
                "variable {k:?} cannot be passed to a container (its name or value spans lines)"
            )));
        }
        text.push_str(&format!("{k}={v}\n"));
    }
    Ok(text)
}

/// The container executor (DESIGN §4.2): each replica a container of its `image` on this
/// machine, through Podman or Docker, so a custom-container trainer runs unchanged on one
/// machine. A replica's container gets the command and rendered arguments, the environment of
/// DESIGN §4 and §4.1 (through an env file readable by the server only: on the engine's
/// command line it would be visible to every local user), the trial's directory mounted at
/// the same path (so the `AIP_*` paths hold inside), `--network=host` (replicas reach each
/// other and the server on 127.0.0.1 at the ports reserved for the cluster), `--init` (so
/// SIGTERM reaches a Python PID 1), resources as `--cpus`/`--memory` and its GPUs as devices,
/// and labels naming study, trial and replica. The engine's client runs attached, as a local
/// process whose output is the replica's log; stopping goes through the engine
/// (`stop`/`rm`), and a restarted service finds leftovers by label.
pub struct ContainerExecutor {
    context: ExecutorContext,
}

impl ContainerExecutor {
    pub fn new(context: ExecutorContext) -> Self {
        Self { context }
    }
}

#[async_trait]
impl Executor for ContainerExecutor {
    async fn launch(
        &self,
        request: &JobRequest,
        stdout_lines: mpsc::UnboundedSender<String>,
    ) -> Result<Box<dyn RunningJob>, ExecutorError> {
        let engine = self.context.containers.clone();
        let (gpus, ports) = reserve_machine(&self.context, request).await?;
        let address = loopback_addresses(request, ports.as_ref());
        let nonce = format!("{:08x}", rand::random::<u32>());
        let names: Vec<String> = request
            .replicas
            .iter()
            .map(|r| container_name(request, r.id, &nonce))
            .collect();
        let mut cluster = LocalCluster::new(
            request.replicas.len(),
            gpus,
            ports,
            Some((engine.clone(), names.clone())),
        );
        // The containers' names and the trial's directory, which a restarted service
        // matches against the containers' labels.
        cluster.set_handle(JobHandle::Containers {
            names: names.clone(),
            trial_dir: request.trial_dir.clone(),
        });
        let mut primary_lines = Some(stdout_lines);
        for (i, replica) in request.replicas.iter().enumerate() {
            let started = self
                .start_replica(request, replica, &names[i], i, &address, &mut cluster)
                .await;
            let lines = if i == 0 { primary_lines.take() } else { None };
            let outcome = match started {
                Ok(argv) => {
                    let launch = Launch {
                        argv,
                        // The engine's client runs with the server's environment; the
                        // container gets only its env file.
                        env: None,
                        workdir: None,
                        user: None,
                    };
                    spawn_replica(request, replica, launch, lines, i, &cluster.exits.0).await
                }
                Err(e) => Err(e),
            };
            cluster.keep(outcome).await?;
        }
        Ok(Box::new(cluster))
    }

    async fn clean_up_stale(&self, handle: &JobHandle, study_id: StudyId, trial_id: TrialId) {
        let JobHandle::Containers { trial_dir, .. } = handle else {
            return;
        };
        let Some(trial_dir) = trial_dir.to_str() else {
            return;
        };
        let engine = &self.context.containers;
        let leftovers = engine.labelled(study_id, trial_id, trial_dir).await;
        if !leftovers.is_empty() {
            tracing::info!(
                %study_id,
                %trial_id,
                ?leftovers,
                "removing containers left by an earlier run"
            );
            engine.remove(&leftovers).await;
        }
    }

    /// `<engine> exec -i [-t] <container> <command…>`: the replica's container, with its own
    /// environment, working directory and user; with `-t` the engine's client runs on the
    /// session's terminal, which it hands on to the container.
    async fn exec(
        &self,
        handle: &JobHandle,
        _target: &ExecTarget,
        request: &ExecRequest,
    ) -> Result<ExecVia, ExecRefused> {
        let JobHandle::Containers { names, .. } = handle else {
            return Err(refused(format!("not a container job: {handle}")));
        };
        // Names end `-<replica>-<nonce>` (`container_name`).
        let marker = format!("-{}-", request.replica.name());
        let name = names.iter().find(|n| n.contains(&marker)).ok_or_else(|| {
            refused_replica(format!(
                "replica {} has no container in this attempt",
                request.replica.name()
            ))
        })?;
        Ok(ExecVia::Process(SessionProcess {
            argv: self.context.containers.exec_argv(name, request),
            ..SessionProcess::default()
        }))
    }
}

impl ContainerExecutor {
    /// Write the replica's env file and return the engine's `run` command for it.
    async fn start_replica(
        &self,
        request: &JobRequest,
        replica: &ReplicaRequest,
        name: &str,
        position: usize,
        address: &(dyn Fn(ReplicaId) -> Address + Sync),
        cluster: &mut LocalCluster,
    ) -> Result<Vec<String>, ExecutorError> {
        let image = replica
            .image
            .as_deref()
            .ok_or_else(|| ExecutorError::Launch(format!("{}: no image", replica.id.name())))?;
        let mut env = request.replica_env(replica, address);
        let gpus: Vec<String> = cluster.gpus_of(position).cloned().unwrap_or_default();
        if !gpus.is_empty() {
            // Inside the container its devices are numbered from 0.
            let visible: Vec<String> = (0..gpus.len()).map(|i| i.to_string()).collect();
            env.push(("CUDA_VISIBLE_DEVICES".to_string(), visible.join(",")));
        }
        // The trial's directory is mounted at the same path: what the job writes is handed to
        // `--run-jobs-as`'s user on the host, as for a local job.
        if let Some(user) = &self.context.run_as {
            user.give_outputs(&request.output_base, &env)?;
        }
        let env_file = request
            .trial_dir
            .join(".container-env")
            .join(format!("{name}.env"));
        write_private(&request.output_base, &env_file, &env_file_text(&env)?)
            .await
            .map_err(|source| ExecutorError::File {
                path: env_file.display().to_string(),
                source,
            })?;
        let run = ContainerRun {
            name,
            study_id: request.study_id,
            trial_id: request.trial_id,
            replica,
            image,
            env_file: &env_file,
            trial_dir: &request.trial_dir,
            workdir: request.workdir.as_deref(),
            gpus: &gpus,
            user: self.context.run_as.as_ref().map(|u| (u.uid, u.gid)),
        };
        Ok(self.context.containers.run_argv(&run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Resources;
    use std::path::PathBuf;

    fn replica() -> ReplicaRequest {
        ReplicaRequest {
            id: ReplicaId { pool: 1, index: 0 },
            argv: vec!["python3".into(), "train.py".into(), "--lr=0.1".into()],
            env: Vec::new(),
            resources: Resources {
                cpu: Some(2.0),
                memory: Some("1Gi".into()),
                gpu: Some(2),
            },
            image: Some("localhost/trainer:1".into()),
            log_path: PathBuf::from("/runs/7/replicas/workerpool1-0.log"),
        }
    }

    #[test]
    fn a_replica_runs_attached_labelled_with_its_env_file_mount_limits_and_devices() {
        let engine = ContainerEngine {
            program: "podman".into(),
            global_args: vec!["--runtime".into(), "runc".into()],
            run_args: vec!["--ulimit".into(), "nofile=1024:1024".into()],
        };
        let r = replica();
        let gpus = vec!["2".to_string(), "5".to_string()];
        let run = ContainerRun {
            name: "augur-s3-t7-a1-workerpool1-0",
            study_id: StudyId::new(3),
            trial_id: TrialId::new(7),
            replica: &r,
            image: "localhost/trainer:1",
            env_file: Path::new("/runs/7/.container-env/x.env"),
            trial_dir: Path::new("/runs/7"),
            workdir: None,
            gpus: &gpus,
            user: Some((1001, 1002)),
        };
        let argv = engine.run_argv(&run).join(" ");
        assert!(
            argv.starts_with("podman --runtime runc run --rm --init --network=host"),
            "{argv}"
        );
        for part in [
            "--label augur.dev/study=3",
            "--label augur.dev/trial=7",
            "--label augur.dev/replica=workerpool1-0",
            "--label augur.dev/trial-dir=/runs/7",
            "--env-file /runs/7/.container-env/x.env",
            "--volume /runs/7:/runs/7",
            "--user 1001:1002",
            "--cpus 2",
            "--memory 1073741824b",
            "--device nvidia.com/gpu=2 --device nvidia.com/gpu=5",
            // The engine's options end before the image, whatever its text.
            "--ulimit nofile=1024:1024 -- localhost/trainer:1 python3 train.py --lr=0.1",
        ] {
            assert!(argv.contains(part), "{part} in {argv}");
        }
        assert!(
            !argv.contains("AUGUR_TRIAL_TOKEN"),
            "no variable on the command line"
        );
    }

    /// A Vertex job's pools, imported with `command` and `args` apart, run as their image
    /// with the command, then the args, then the trial's values (what Vertex runs for an
    /// image without an ENTRYPOINT); a pool with args only runs them after its image.
    #[test]
    fn a_vertex_pools_command_and_args_reach_the_engine_in_order() {
        let doc = serde_json::json!({
            "displayName": "args", "maxTrialCount": 1,
            "studySpec": {
                "metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
                "parameters": [{"parameterId": "lr", "doubleValueSpec": {"minValue": 0.01, "maxValue": 1}}]
            },
            "trialJobSpec": {"workerPoolSpecs": [
                {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
                 "containerSpec": {"imageUri": "localhost/trainer:1", "command": ["python3", "train.py"], "args": ["--epochs=5", "--run=t${trial_id}"]}},
                {"machineSpec": {"machineType": "n1-standard-4"}, "replicaCount": 1,
                 "containerSpec": {"imageUri": "localhost/evaluator:1", "args": ["--mode=eval"]}}
            ]}
        });
        let spec = crate::model::vertex::from_vertex(&doc)
            .expect("import")
            .spec;
        let job = spec.trial_job.expect("a trial job");
        let study = crate::model::StudyDir {
            base: "/runs".into(),
            dir: "/runs/study-1".into(),
        };
        let dirs = crate::model::TrialDirs::new(&study, TrialId::new(7));
        let values = [("lr".to_string(), augur_optimizer::Value::Float(0.1))].into();
        let replicas =
            crate::dispatch::trial::replica_requests(&job, &values, TrialId::new(7), &dirs);
        let engine = ContainerEngine {
            program: "podman".into(),
            global_args: Vec::new(),
            run_args: Vec::new(),
        };
        let after_options = |r: &ReplicaRequest| {
            let run = ContainerRun {
                name: "x",
                study_id: StudyId::new(1),
                trial_id: TrialId::new(7),
                replica: r,
                image: r.image.as_deref().unwrap_or_default(),
                env_file: Path::new("/runs/study-1/7/.container-env/x.env"),
                trial_dir: Path::new("/runs/study-1/7"),
                workdir: None,
                gpus: &[],
                user: None,
            };
            let argv = engine.run_argv(&run);
            let end = argv.iter().position(|a| a == "--").expect("--");
            argv[end + 1..].join(" ")
        };
        assert_eq!(
            after_options(&replicas[0]),
            "localhost/trainer:1 python3 train.py --epochs=5 --run=t7 --lr=0.1"
        );
        assert_eq!(
            after_options(&replicas[1]),
            "localhost/evaluator:1 --mode=eval --lr=0.1"
        );
    }

    #[test]
    fn env_files_refuse_what_they_cannot_hold() {
        assert_eq!(
            env_file_text(&[("A".into(), "x=1 y".into())])
                .ok()
                .as_deref(),
            Some("A=x=1 y\n")
        );
        assert!(env_file_text(&[("A".into(), "two\nlines".into())]).is_err());
    }
}
