//! What a study's `trial_job` may run (`augur serve --job-commands`, `--job-images`).
//! Without either list, anything (for operators and admins). With one, every replica's
//! program must be allowed: on this machine or Slurm (executors `local`, `slurm`) its
//! command must start with one of the allowed command prefixes, and its `env` may not set
//! variables that change which program runs or what it loads (`PATH`, `LD_PRELOAD`,
//! `PYTHONPATH`, …), which would make any allowed prefix run anything; in a container
//! (executors `container`, `kubernetes`) its image must start with one of the allowed image
//! prefixes: the image is what runs, whatever its command. A kind with no list of its own is
//! refused while the other has one: an operator who limits commands does not mean to allow
//! any image, nor the reverse. Each worker pool's own command, image and `env` are checked.
//!
//! A command prefix is either whole arguments (`/usr/bin/python3 /opt/trainers/train.py`:
//! the command's first arguments must be exactly these) or a directory (ending in `/`:
//! `/opt/trainers/`: the program must be an absolute path inside it, without `..`). Relative
//! programs and scripts resolve against the job's `workdir`, which the spec chooses: allow
//! absolute paths. An image prefix is text the image reference starts with
//! (`registry.example.com/ml/`).

use super::{ServiceError, ServiceResult};
use std::collections::BTreeMap;

use crate::model::TrialJobSpec;

/// Variables a job's `env` may not set while an allow-list is in force: each can make an
/// allowed program run or load code of the spec's choosing.
const LOADER_VARIABLES: [&str; 8] = [
    "PATH",
    "BASH_ENV",
    "ENV",
    "IFS",
    "SHELLOPTS",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "NODE_OPTIONS",
];
/// Prefixes of such variables (dynamic loaders, interpreters' search paths and start-up
/// files).
const LOADER_PREFIXES: [&str; 8] = [
    "LD_", "DYLD_", "PYTHON", "PERL", "RUBY", "NODE_", "LUA_", "R_",
];

/// Interpreter settings that load nothing, allowed all the same.
const HARMLESS: [&str; 4] = [
    "PYTHONUNBUFFERED",
    "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONIOENCODING",
];

#[derive(Debug, Clone, Default)]
pub struct JobPolicy {
    /// Allowed command prefixes (`--job-commands`).
    pub command_prefixes: Vec<String>,
    /// Allowed image prefixes (`--job-images`).
    pub image_prefixes: Vec<String>,
}

/// What one worker pool runs, and the spec fields that say so.
struct PoolRun<'a> {
    command: &'a [String],
    command_field: String,
    image: Option<&'a str>,
    image_field: String,
    env: Vec<(&'a String, String)>,
}

impl JobPolicy {
    pub fn new(command_prefixes: Vec<String>, image_prefixes: Vec<String>) -> Self {
        let clean = |list: Vec<String>| -> Vec<String> {
            list.into_iter()
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect()
        };
        Self {
            command_prefixes: clean(command_prefixes),
            image_prefixes: clean(image_prefixes),
        }
    }

    /// Refuse a job this server does not run (403, naming the field).
    pub fn check(&self, job: &TrialJobSpec) -> ServiceResult<()> {
        if self.command_prefixes.is_empty() && self.image_prefixes.is_empty() {
            return Ok(());
        }
        for run in pool_runs(job) {
            if job.executor.runs_images() {
                let image = run.image.unwrap_or("");
                if !self
                    .image_prefixes
                    .iter()
                    .any(|p| image.starts_with(p.as_str()))
                {
                    return Err(refused(
                        "images",
                        "--job-images",
                        &self.image_prefixes,
                        run.image_field,
                    ));
                }
                continue;
            }
            if !self.command_prefixes.iter().any(|p| allows(p, run.command)) {
                return Err(refused(
                    "commands",
                    "--job-commands",
                    &self.command_prefixes,
                    run.command_field,
                ));
            }
            if let Some((name, field)) = run.env.iter().find(|(name, _)| is_loader_variable(name)) {
                return Err(ServiceError::PermissionDenied {
                    message: format!(
                        "{name} changes which program runs or what it loads: not settable while \
                         this server allows only some commands"
                    ),
                    field: Some(field.clone()),
                });
            }
        }
        Ok(())
    }
}

/// What each worker pool runs (the job's own command, image and `env` when it has no pools).
fn pool_runs(job: &TrialJobSpec) -> Vec<PoolRun<'_>> {
    let job_run = || PoolRun {
        command: &job.command,
        command_field: "trial_job.command".into(),
        image: job.image.as_deref(),
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
            if let Some(command) = &pool.command {
                run.command = command;
                run.command_field = format!("{at}.command");
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
fn allows(prefix: &str, command: &[String]) -> bool {
    let Some(program) = command.first() else {
        return false;
    };
    if prefix.ends_with('/') {
        return program.starts_with('/')
            && program.starts_with(prefix)
            && !program.split('/').any(|part| part == "..");
    }
    let words: Vec<&str> = prefix.split_whitespace().collect();
    words.len() <= command.len() && words.iter().zip(command).all(|(w, c)| *w == c)
}

fn is_loader_variable(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if HARMLESS.contains(&upper.as_str()) {
        return false;
    }
    LOADER_VARIABLES.contains(&upper.as_str())
        || LOADER_PREFIXES.iter().any(|p| upper.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn loader_variables_are_recognised() {
        for name in [
            "PATH",
            "LD_PRELOAD",
            "PYTHONPATH",
            "pythonstartup",
            "PERL5OPT",
            "BASH_ENV",
        ] {
            assert!(is_loader_variable(name), "{name}");
        }
        assert!(!is_loader_variable("CUDA_VISIBLE_DEVICES"));
        assert!(!is_loader_variable("OMP_NUM_THREADS"));
        assert!(!is_loader_variable("PYTHONUNBUFFERED"));
    }

    fn job(value: serde_json::Value) -> TrialJobSpec {
        serde_json::from_value(value).expect("job spec")
    }

    /// The field of the refusal, or `None` when the job is allowed.
    fn refused_field(policy: &JobPolicy, value: serde_json::Value) -> Option<String> {
        match policy.check(&job(value)) {
            Ok(()) => None,
            Err(ServiceError::PermissionDenied { field, .. }) => field,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn every_worker_pools_command_and_env_is_checked() {
        let policy = JobPolicy::new(vec!["/opt/t/".into()], vec![]);
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

    #[test]
    fn images_need_a_list_of_their_own_once_any_list_is_set() {
        let container = |image: &str| serde_json::json!({"executor": "container", "image": image, "command": ["/bin/sh"]});
        assert_eq!(
            refused_field(&JobPolicy::default(), container("evil/miner")),
            None
        );
        let commands_only = JobPolicy::new(vec!["/opt/t/".into()], vec![]);
        assert_eq!(
            refused_field(&commands_only, container("registry.example.com/ml/t:1")).as_deref(),
            Some("trial_job.image")
        );
        let images = JobPolicy::new(vec![], vec!["registry.example.com/ml/".into()]);
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
