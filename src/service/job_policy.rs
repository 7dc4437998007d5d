//! What a study's `trial_job` may run (`augur serve --job-commands`, `--job-images`,
//! `--job-env-allow`) and where on Kubernetes (`--kubernetes-service-accounts`,
//! `--kubernetes-namespaces`, `--kubernetes-claims`).

use super::{ServiceError, ServiceResult};
use std::collections::BTreeMap;

use crate::model::executor::OutputVolume;
use crate::model::image::{AllowedImages, ImageRef};
use crate::model::{Role, TrialJobSpec};

/// Variables a job's `env` may set while a command list is in force, besides the
/// operator's `--job-env-allow`: each only tunes a program, none names code or a place to
/// load it from.
const HARMLESS_ENV: [&str; 17] = [
    "PYTHONUNBUFFERED",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONIOENCODING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "TF_CPP_MIN_LOG_LEVEL",
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_DETERMINISTIC_OPS",
    "NCCL_DEBUG",
    "TORCH_SHOW_CPP_STACKTRACES",
    "CUBLAS_WORKSPACE_CONFIG",
    "TOKENIZERS_PARALLELISM",
    "WANDB_MODE",
];

/// Programs that run whatever their arguments say (`python3 -c …`, `sh -c …`, `env prog`):
/// a command prefix of one of these alone allows anything.
const INTERPRETERS: [&str; 26] = [
    "sh", "bash", "dash", "zsh", "ksh", "fish", "csh", "tcsh", "busybox", "env", "python", "perl",
    "ruby", "node", "nodejs", "deno", "bun", "php", "lua", "luajit", "julia", "java", "rscript",
    "r", "tclsh", "awk",
];

/// Directories of the system's programs: a directory prefix there allows every shell.
const SYSTEM_BIN_DIRS: [&str; 7] = [
    "/",
    "/bin/",
    "/sbin/",
    "/usr/bin/",
    "/usr/sbin/",
    "/usr/local/bin/",
    "/usr/local/sbin/",
];

/// The operator's lists, checked against every worker pool of a `trial_job`.
///
/// Without a command or image list, any program (for operators and admins). With one, every
/// replica's program must be allowed: on this machine or Slurm (executors `local`, `slurm`)
/// its command must start with one of the allowed command prefixes, with no placeholder
/// (`${p}`) in the words the prefix covers (a placeholder is filled in per trial: a
/// categorical `../../bin/sh` would leave the allowed directory), and its `env` may set only
/// variables known to load no code (`PYTHONUNBUFFERED`, `OMP_NUM_THREADS`, …) and those the
/// operator allows (`--job-env-allow`): an allow-list, since interpreters and libraries read
/// many variables that run code (`HOME` finds Python's `.pth` files, `BASH_FUNC_*%%` defines
/// shell functions, `OPENSSL_CONF` and `GCONV_PATH` load modules). In a container (executors
/// `container`, `kubernetes`) its image must be allowed: the image is what runs, whatever its
/// command. A kind with no list of its own is refused while the other has one: an operator
/// who limits commands does not mean to allow any image, nor the reverse. Each worker pool's
/// own command, image and `env` are checked.
///
/// A command prefix is either whole arguments (`/usr/bin/python3 /opt/trainers/train.py`:
/// the command's first arguments must be exactly these) or a directory (ending in `/`:
/// `/opt/trainers/`: the program must be an absolute path inside it, without `..`). Relative
/// programs and scripts resolve against the job's `workdir`, which the spec chooses: allow
/// absolute paths. An allowed image is matched by its parts ([`AllowedImages`]).
///
/// On Kubernetes, a pod's service account, namespace and volume claim decide what it can
/// reach (the server's own account reads its Secrets; the database's claim holds its files):
/// a spec may name them only from the operator's lists, or with an admin's token, and never
/// the server's own service account.
#[derive(Debug, Clone, Default)]
pub struct JobPolicy {
    /// Allowed command prefixes (`--job-commands`).
    pub command_prefixes: Vec<String>,
    /// Allowed images (`--job-images`), as given and parsed.
    image_entries: Vec<(String, AllowedImages)>,
    /// Variables (or `PREFIX*`) a spec's `env` may set besides `HARMLESS_ENV` while a
    /// command list is in force (`--job-env-allow`).
    pub env_allow: Vec<String>,
    pub kubernetes: KubernetesPolicy,
}

/// Where on Kubernetes a spec may place its pods.
#[derive(Debug, Clone, Default)]
pub struct KubernetesPolicy {
    /// Service accounts a spec may name (`--kubernetes-service-accounts`).
    pub service_accounts: Vec<String>,
    /// Namespaces a spec may name (`--kubernetes-namespaces`).
    pub namespaces: Vec<String>,
    /// PersistentVolumeClaims a spec may mount (`--kubernetes-claims`).
    pub claims: Vec<String>,
    /// The server's own service account (`--kubernetes-own-service-account`, set from the
    /// pod's `spec.serviceAccountName` by `deploy/`): never a trial's, not even an admin's.
    pub own_service_account: Option<String>,
}

/// What one worker pool runs, and the spec fields that say so.
struct PoolRun<'a> {
    /// The words before the values: the command, then its `args` (a prefix may cover both).
    command: Vec<&'a String>,
    command_field: String,
    image: Option<&'a str>,
    image_field: String,
    env: Vec<(&'a String, String)>,
}

impl JobPolicy {
    /// A policy from the operator's lists; an entry of `--job-images` that is no image
    /// reference (or path ending in `/`) is an error.
    pub fn new(command_prefixes: Vec<String>, image_prefixes: Vec<String>) -> Result<Self, String> {
        let image_entries = clean(image_prefixes)
            .into_iter()
            .map(|entry| {
                AllowedImages::parse(&entry)
                    .map(|allowed| (entry.clone(), allowed))
                    .map_err(|e| format!("--job-images {entry:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            command_prefixes: clean(command_prefixes),
            image_entries,
            env_allow: Vec::new(),
            kubernetes: KubernetesPolicy::default(),
        })
    }

    pub fn with_env_allow(mut self, names: Vec<String>) -> Self {
        self.env_allow = clean(names);
        self
    }

    pub fn with_kubernetes(mut self, policy: KubernetesPolicy) -> Result<Self, String> {
        if let Some(own) = &policy.own_service_account
            && policy.service_accounts.contains(own)
        {
            return Err(format!(
                "--kubernetes-service-accounts lists {own:?}, the server's own service account: \
                 its pods could read the server's Secrets"
            ));
        }
        self.kubernetes = KubernetesPolicy {
            service_accounts: clean(policy.service_accounts),
            namespaces: clean(policy.namespaces),
            claims: clean(policy.claims),
            own_service_account: policy.own_service_account.filter(|a| !a.trim().is_empty()),
        };
        Ok(self)
    }

    /// What an operator should know about these lists at start-up: entries that allow any
    /// program after all (a bare interpreter allows `python3 -c <anything>`).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for prefix in &self.command_prefixes {
            if SYSTEM_BIN_DIRS.contains(&prefix.as_str()) {
                out.push(format!(
                    "--job-commands {prefix:?} allows every program there, shells and \
                     interpreters too: any command"
                ));
                continue;
            }
            let words: Vec<&str> = prefix.split_whitespace().collect();
            if let [program] = words.as_slice()
                && is_interpreter(program)
            {
                out.push(format!(
                    "--job-commands {prefix:?} is an interpreter alone: it allows `{program} -c \
                     <anything>`; name the script too (\"{program} /opt/trainers/train.py\")"
                ));
            }
        }
        out
    }

    /// Refuse a job this server does not run (403, naming the field). `role` is the
    /// creator's: admins may place pods anywhere but in the server's own account.
    pub fn check(&self, job: &TrialJobSpec, role: Role) -> ServiceResult<()> {
        self.check_kubernetes(job, role)?;
        if self.command_prefixes.is_empty() && self.image_entries.is_empty() {
            return Ok(());
        }
        for run in pool_runs(job) {
            if job.executor.runs_images() {
                self.check_image(&run)?;
                continue;
            }
            self.check_command(&run)?;
            if let Some((name, field)) = run.env.iter().find(|(name, _)| !self.env_allowed(name)) {
                return Err(ServiceError::PermissionDenied {
                    message: format!(
                        "{name}: while this server allows only some commands, a job's env may \
                         set only variables that load no code ({}) and those its operator \
                         allows with --job-env-allow",
                        HARMLESS_ENV.join(", ")
                    ),
                    field: Some(field.clone()),
                });
            }
        }
        Ok(())
    }

    /// Whether a session (`service::exec`) may run `command` in a trial of `job`: in a
    /// container (executors `container`, `kubernetes`) whatever runs there is confined to
    /// the allowed image; on this machine or Slurm, a server that allows only some commands
    /// allows a session only those too (or a session would run what no trial may).
    pub fn check_exec(&self, job: &TrialJobSpec, command: &[String]) -> ServiceResult<()> {
        if job.executor.runs_images()
            || (self.command_prefixes.is_empty() && self.image_entries.is_empty())
            || self.command_prefixes.iter().any(|p| allows(p, command))
        {
            return Ok(());
        }
        Err(refused(
            "commands",
            "--job-commands",
            &self.command_prefixes,
            "command".to_string(),
        ))
    }

    fn check_image(&self, run: &PoolRun<'_>) -> ServiceResult<()> {
        let allowed = run
            .image
            .and_then(|image| ImageRef::parse(image).ok())
            .is_some_and(|image| {
                self.image_entries
                    .iter()
                    .any(|(_, entry)| image.allowed_by(entry))
            });
        if allowed {
            return Ok(());
        }
        let entries: Vec<String> = self.image_entries.iter().map(|(e, _)| e.clone()).collect();
        Err(refused(
            "images",
            "--job-images",
            &entries,
            run.image_field.clone(),
        ))
    }

    fn check_command(&self, run: &PoolRun<'_>) -> ServiceResult<()> {
        if let Some(program) = run.command.first()
            && program.contains("${")
        {
            return Err(ServiceError::PermissionDenied {
                message: format!(
                    "{program:?}: the program may not hold a placeholder while this server \
                     allows only some commands (a value could name any program)"
                ),
                field: Some(format!("{}[0]", run.command_field)),
            });
        }
        if self
            .command_prefixes
            .iter()
            .any(|p| allows(p, &run.command))
        {
            return Ok(());
        }
        Err(refused(
            "commands",
            "--job-commands",
            &self.command_prefixes,
            run.command_field.clone(),
        ))
    }

    fn env_allowed(&self, name: &str) -> bool {
        HARMLESS_ENV.contains(&name)
            || self
                .env_allow
                .iter()
                .any(|allowed| match allowed.strip_suffix('*') {
                    Some(prefix) => name.starts_with(prefix),
                    None => allowed == name,
                })
    }

    fn check_kubernetes(&self, job: &TrialJobSpec, role: Role) -> ServiceResult<()> {
        let Some(options) = job.executor.kubernetes() else {
            return Ok(());
        };
        let policy = &self.kubernetes;
        let field = |f: &str| format!("trial_job.kubernetes.{f}");
        if let Some(account) = &options.service_account {
            if policy.own_service_account.as_ref() == Some(account) {
                return Err(ServiceError::PermissionDenied {
                    message: format!(
                        "{account:?} is the server's own service account: a trial's pods may \
                         not read the server's Secrets"
                    ),
                    field: Some(field("service_account")),
                });
            }
            listed(
                role,
                account,
                &policy.service_accounts,
                "--kubernetes-service-accounts",
                field("service_account"),
            )?;
        }
        if let Some(namespace) = &options.namespace {
            listed(
                role,
                namespace,
                &policy.namespaces,
                "--kubernetes-namespaces",
                field("namespace"),
            )?;
        }
        if let Some(OutputVolume::PersistentVolumeClaim { claim_name, .. }) = &options.output_volume
        {
            listed(
                role,
                claim_name,
                &policy.claims,
                "--kubernetes-claims",
                field("output_volume.claim_name"),
            )?;
        }
        Ok(())
    }
}

/// Trimmed, non-empty entries.
fn clean(list: Vec<String>) -> Vec<String> {
    list.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// `value` is in the operator's `list` (`flag`), or the caller is an admin.
fn listed(
    role: Role,
    value: &str,
    list: &[String],
    flag: &str,
    field: String,
) -> ServiceResult<()> {
    if role >= Role::Admin || list.iter().any(|v| v == value) {
        return Ok(());
    }
    Err(ServiceError::PermissionDenied {
        message: format!(
            "{value:?} is not among those this server's operator allows ({flag}: {}); an \
             admin's token may name it",
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        ),
        field: Some(field),
    })
}

/// Whether a program (a path or a name) is a shell or an interpreter.
fn is_interpreter(program: &str) -> bool {
    let name = program
        .rsplit('/')
        .next()
        .unwrap_or(program)
        .to_ascii_lowercase();
    // python3, python3.11, perl5.36, …
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    INTERPRETERS.contains(&stem)
}

/// What each worker pool runs (the job's own command, image and `env` when it has no pools).
fn pool_runs(job: &TrialJobSpec) -> Vec<PoolRun<'_>> {
    let job_run = || PoolRun {
        command: job.command.iter().chain(&job.args).collect(),
        command_field: "trial_job.command".into(),
        image: job.executor.image(),
        image_field: "trial_job.image".into(),
        env: env_of(&job.env, "trial_job"),
    };
    if job.worker_pools.is_empty() {
        return vec![job_run()];
    }
    job.worker_pools
        .iter()
        .enumerate()
        .filter_map(|(i, pool)| pool.as_ref().map(|p| (i, p)))
        .map(|(i, pool)| {
            let at = format!("trial_job.worker_pools[{i}]");
            let mut run = job_run();
            if pool.command.is_some() || pool.args.is_some() {
                let command = pool.command.as_ref().unwrap_or(&job.command);
                let args = pool.args.as_ref().unwrap_or(&job.args);
                run.command = command.iter().chain(args).collect();
            }
            if pool.command.is_some() {
                run.command_field = format!("{at}.command");
            } else if pool.args.is_some() {
                run.command_field = format!("{at}.args");
            }
            if let Some(image) = &pool.image {
                run.image = Some(image);
                run.image_field = format!("{at}.image");
            }
            run.env.extend(env_of(&pool.env, &at));
            run
        })
        .collect()
}

/// A spec's `env` names, each with its field.
fn env_of<'a>(env: &'a BTreeMap<String, String>, prefix: &str) -> Vec<(&'a String, String)> {
    env.keys()
        .map(|k| (k, format!("{prefix}.env.{k}")))
        .collect()
}

/// The 403 for a program outside the allow-list of its kind (`what`: commands or images).
fn refused(what: &str, flag: &str, allowed: &[String], field: String) -> ServiceError {
    let message = if allowed.is_empty() {
        format!(
            "this server allows only some jobs and no {what} ({flag} is not set): ask its \
             operator"
        )
    } else {
        format!(
            "this server runs only {what} starting with one of: {}",
            allowed
                .iter()
                .map(|p| format!("{p:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    ServiceError::PermissionDenied {
        message,
        field: Some(field),
    }
}

/// Whether `prefix` allows `command`: a directory (`/opt/trainers/`) holding the program,
/// or the command's first arguments, word for word.
fn allows(prefix: &str, command: &[impl AsRef<str>]) -> bool {
    let Some(program) = command.first().map(AsRef::as_ref) else {
        return false;
    };
    if prefix.ends_with('/') {
        return program.starts_with('/')
            && program.starts_with(prefix)
            && !program.split('/').any(|part| part == "..");
    }
    // A placeholder never matches: what the trial is given is not what was checked.
    let words: Vec<&str> = prefix.split_whitespace().collect();
    words.len() <= command.len()
        && words
            .iter()
            .zip(command)
            .all(|(w, c)| *w == c.as_ref() && !c.as_ref().contains("${"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session in a trial runs only what a trial could: on this machine, the allowed
    /// commands; in a container, anything (the allowed image confines it).
    #[test]
    fn a_session_on_this_machine_runs_only_allowed_commands() {
        let policy = JobPolicy::new(vec!["/opt/tools/".into()], vec!["localhost/trainer".into()])
            .expect("policy");
        let local: TrialJobSpec = serde_json::from_value(serde_json::json!({
            "command": ["/opt/tools/train"]
        }))
        .expect("job");
        let container: TrialJobSpec = serde_json::from_value(serde_json::json!({
            "executor": "container", "image": "localhost/trainer:1", "command": ["train"]
        }))
        .expect("job");
        assert!(
            policy
                .check_exec(&local, &argv(&["/opt/tools/py-spy", "dump"]))
                .is_ok()
        );
        let refused = policy.check_exec(&local, &argv(&["/bin/sh"]));
        assert!(
            matches!(refused, Err(ServiceError::PermissionDenied { field: Some(ref f), .. }) if f == "command"),
            "{refused:?}"
        );
        assert!(policy.check_exec(&container, &argv(&["/bin/sh"])).is_ok());
        assert!(
            JobPolicy::default()
                .check_exec(&local, &argv(&["/bin/sh"]))
                .is_ok()
        );
    }

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn a_prefix_matches_whole_arguments_or_a_directory() {
        let p = "/usr/bin/python3 /opt/t/train.py";
        assert!(allows(
            p,
            &argv(&["/usr/bin/python3", "/opt/t/train.py", "--lr=1"])
        ));
        assert!(!allows(p, &argv(&["/usr/bin/python3", "/opt/t/train.pyx"])));
        assert!(!allows(p, &argv(&["/usr/bin/python3", "-c", "import os"])));
        assert!(!allows(p, &argv(&["/usr/bin/python3"])));
        assert!(allows("/opt/t/", &argv(&["/opt/t/run.sh"])));
        assert!(!allows("/opt/t/", &argv(&["/opt/t/../../bin/sh"])));
        assert!(!allows("/opt/t/", &argv(&["/opt/tx/run.sh"])));
        assert!(!allows("/opt/t/", &argv(&["run.sh"])));
    }

    #[test]
    fn a_job_may_set_only_variables_that_load_no_code_and_those_allowed() {
        let policy = JobPolicy::new(vec!["/opt/t/".into()], vec![])
            .expect("policy")
            .with_env_allow(vec!["WANDB_PROJECT".into(), "MYAPP_*".into()]);
        for name in [
            "PATH",
            "LD_PRELOAD",
            "LD_AUDIT",
            "PYTHONPATH",
            "PYTHONHOME",
            "pythonstartup",
            "PERL5OPT",
            "RUBYOPT",
            "NODE_OPTIONS",
            "BASH_ENV",
            "BASH_FUNC_ls%%",
            "HOME",
            "OPENSSL_CONF",
            "GCONV_PATH",
            "GIT_CONFIG_COUNT",
            "JDK_JAVA_OPTIONS",
            "JAVA_TOOL_OPTIONS",
            "CLASSPATH",
            "TMPDIR",
            "XDG_CONFIG_HOME",
            "MYAPP",
        ] {
            assert!(!policy.env_allowed(name), "{name}");
        }
        for name in [
            "OMP_NUM_THREADS",
            "PYTHONUNBUFFERED",
            "WANDB_PROJECT",
            "MYAPP_SEED",
        ] {
            assert!(policy.env_allowed(name), "{name}");
        }
    }

    #[test]
    fn placeholders_are_refused_where_the_allow_list_looks() {
        let policy = JobPolicy::new(
            vec!["/opt/t/".into(), "/usr/bin/python3 /opt/s/train.py".into()],
            vec![],
        )
        .expect("policy");
        let field = |command: serde_json::Value| {
            refused_field(&policy, serde_json::json!({ "command": command }))
        };
        assert_eq!(
            field(serde_json::json!(["/opt/t/${p}", "-c", "id"])).as_deref(),
            Some("trial_job.command[0]")
        );
        assert_eq!(
            field(serde_json::json!(["${args}"])).as_deref(),
            Some("trial_job.command[0]")
        );
        assert_eq!(
            field(serde_json::json!(["/usr/bin/python3", "${script}"])).as_deref(),
            Some("trial_job.command")
        );
        // Past the words the list covers, values are the allowed program's arguments.
        assert_eq!(field(serde_json::json!(["/opt/t/run", "--lr=${lr}"])), None);
        assert_eq!(
            field(serde_json::json!([
                "/usr/bin/python3",
                "/opt/s/train.py",
                "${args}"
            ])),
            None
        );
    }

    #[test]
    fn a_bare_interpreter_or_a_system_directory_is_warned_about() {
        let policy = JobPolicy::new(
            vec![
                "/usr/bin/python3".into(),
                "python3.11".into(),
                "/bin/bash".into(),
                "/usr/bin/".into(),
                "/usr/bin/python3 /opt/t/train.py".into(),
                "/opt/trainers/".into(),
                "/opt/t/train".into(),
            ],
            vec![],
        )
        .expect("policy");
        let warnings = policy.warnings();
        assert_eq!(warnings.len(), 4, "{warnings:#?}");
        assert!(
            warnings[0].contains("`/usr/bin/python3 -c <anything>`"),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[3].contains("every program there"),
            "{}",
            warnings[3]
        );
    }

    #[test]
    fn kubernetes_placement_needs_the_operators_list_or_an_admin() {
        let policy = JobPolicy::default()
            .with_kubernetes(KubernetesPolicy {
                service_accounts: vec!["trainer".into()],
                namespaces: vec!["ml".into()],
                claims: vec!["runs".into()],
                own_service_account: Some("augur".into()),
            })
            .expect("policy");
        let check = |options: serde_json::Value, role: Role| {
            let job = job(serde_json::json!({
                "executor": "kubernetes", "image": "t:1", "command": [], "kubernetes": options
            }));
            match policy.check(&job, role) {
                Ok(()) => None,
                Err(ServiceError::PermissionDenied { field, .. }) => field,
                Err(other) => panic!("unexpected {other:?}"),
            }
        };
        let op = Role::Operator;
        assert_eq!(
            check(
                serde_json::json!({"service_account": "trainer", "namespace": "ml"}),
                op
            ),
            None
        );
        assert_eq!(
            check(serde_json::json!({"service_account": "default"}), op).as_deref(),
            Some("trial_job.kubernetes.service_account")
        );
        assert_eq!(
            check(
                serde_json::json!({"service_account": "default"}),
                Role::Admin
            ),
            None
        );
        for role in [op, Role::Admin] {
            assert_eq!(
                check(serde_json::json!({"service_account": "augur"}), role).as_deref(),
                Some("trial_job.kubernetes.service_account")
            );
        }
        assert_eq!(
            check(serde_json::json!({"namespace": "kube-system"}), op).as_deref(),
            Some("trial_job.kubernetes.namespace")
        );
        let claim = |name: &str| serde_json::json!({"output_volume": {"persistent_volume_claim": {"claim_name": name, "mount_path": "/mnt"}}});
        assert_eq!(check(claim("runs"), op), None);
        assert_eq!(
            check(claim("augur-postgres-data"), op).as_deref(),
            Some("trial_job.kubernetes.output_volume.claim_name")
        );
        // The server's own account cannot be listed.
        assert!(
            JobPolicy::default()
                .with_kubernetes(KubernetesPolicy {
                    service_accounts: vec!["augur".into()],
                    own_service_account: Some("augur".into()),
                    ..KubernetesPolicy::default()
                })
                .is_err()
        );
    }

    fn job(value: serde_json::Value) -> TrialJobSpec {
        serde_json::from_value(value).expect("job spec")
    }

    /// The field of the refusal, or `None` when the job is allowed.
    fn refused_field(policy: &JobPolicy, value: serde_json::Value) -> Option<String> {
        match policy.check(&job(value), Role::Operator) {
            Ok(()) => None,
            Err(ServiceError::PermissionDenied { field, .. }) => field,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn every_worker_pools_command_and_env_is_checked() {
        let policy = JobPolicy::new(vec!["/opt/t/".into()], vec![]).expect("policy");
        let allowed = serde_json::json!({"command": ["/opt/t/train.sh"]});
        assert_eq!(refused_field(&policy, allowed), None);
        let pool_command = serde_json::json!({
            "command": ["/opt/t/train.sh"],
            "worker_pools": [{}, {"replicas": 2, "command": ["/bin/sh", "-c", "id"]}]
        });
        assert_eq!(
            refused_field(&policy, pool_command).as_deref(),
            Some("trial_job.worker_pools[1].command")
        );
        let pool_env = serde_json::json!({
            "command": ["/opt/t/train.sh"],
            "worker_pools": [{}, null, {"env": {"LD_PRELOAD": "/tmp/x.so"}}]
        });
        assert_eq!(
            refused_field(&policy, pool_env).as_deref(),
            Some("trial_job.worker_pools[2].env.LD_PRELOAD")
        );
        // The job's own command is not run when every pool has its own.
        let overridden = serde_json::json!({
            "command": ["/bin/sh"],
            "worker_pools": [{"command": ["/opt/t/a.sh"]}, {"command": ["/opt/t/b.sh"]}]
        });
        assert_eq!(refused_field(&policy, overridden), None);
    }

    /// A prefix may cover the `args` too: the words checked are the command, then the args,
    /// as the replica runs them; a pool's own args are checked where the pool runs them.
    #[test]
    fn a_command_prefix_is_matched_against_the_command_then_its_args() {
        let policy = JobPolicy::new(vec!["/usr/bin/python3 /opt/t/train.py".into()], vec![])
            .expect("policy");
        let split = serde_json::json!({"command": ["/usr/bin/python3"], "args": ["/opt/t/train.py", "--epochs=5"]});
        assert_eq!(refused_field(&policy, split), None);
        let other =
            serde_json::json!({"command": ["/usr/bin/python3"], "args": ["-c", "import os"]});
        assert_eq!(
            refused_field(&policy, other).as_deref(),
            Some("trial_job.command")
        );
        let pool_args = serde_json::json!({
            "command": ["/usr/bin/python3"],
            "args": ["/opt/t/train.py"],
            "worker_pools": [{}, {"args": ["-m", "http.server"]}]
        });
        assert_eq!(
            refused_field(&policy, pool_args).as_deref(),
            Some("trial_job.worker_pools[1].args")
        );
    }

    #[test]
    fn images_need_a_list_of_their_own_once_any_list_is_set() {
        let container = |image: &str| serde_json::json!({"executor": "container", "image": image, "command": ["/bin/sh"]});
        assert_eq!(
            refused_field(&JobPolicy::default(), container("evil/miner")),
            None
        );
        let commands_only = JobPolicy::new(vec!["/opt/t/".into()], vec![]).expect("policy");
        assert_eq!(
            refused_field(&commands_only, container("registry.example.com/ml/t:1")).as_deref(),
            Some("trial_job.image")
        );
        let images =
            JobPolicy::new(vec![], vec!["registry.example.com/ml/".into()]).expect("policy");
        assert_eq!(
            refused_field(&images, container("registry.example.com/ml/t:1")),
            None
        );
        assert_eq!(
            refused_field(&images, container("registry.example.com/mlx/t:1")).as_deref(),
            Some("trial_job.image")
        );
        let pool_image = serde_json::json!({
            "executor": "kubernetes",
            "image": "registry.example.com/ml/t:1",
            "command": [],
            "worker_pools": [{}, {"image": "docker.io/evil/miner"}]
        });
        assert_eq!(
            refused_field(&images, pool_image).as_deref(),
            Some("trial_job.worker_pools[1].image")
        );
        // An image list alone leaves no command allowed on the machine itself.
        assert_eq!(
            refused_field(&images, serde_json::json!({"command": ["/opt/t/train.sh"]})).as_deref(),
            Some("trial_job.command")
        );
    }
}
