//! What commands the server lets a study's `trial_job` run (`augur serve --job-commands`).
//! Without a list, any (for operators and admins); with one, the job's command must start
//! with one of the allowed prefixes, and its `env` may not set variables that change which
//! program runs or what it loads (`PATH`, `LD_PRELOAD`, `PYTHONPATH`, …), which would make
//! any allowed prefix run anything.
//!
//! A prefix is either whole arguments (`/usr/bin/python3 /opt/trainers/train.py`: the
//! command's first arguments must be exactly these) or a directory (ending in `/`:
//! `/opt/trainers/`: the program must be an absolute path inside it, without `..`). Relative
//! programs and scripts resolve against the job's `workdir`, which the spec chooses: allow
//! absolute paths.

use super::{ServiceError, ServiceResult};
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
    /// Allowed command prefixes; empty: any command.
    pub command_prefixes: Vec<String>,
}

impl JobPolicy {
    pub fn new(command_prefixes: Vec<String>) -> Self {
        Self {
            command_prefixes: command_prefixes
                .into_iter()
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
        }
    }

    /// Refuse a job this server does not run (403, naming the field).
    pub fn check(&self, job: &TrialJobSpec) -> ServiceResult<()> {
        if self.command_prefixes.is_empty() {
            return Ok(());
        }
        if !self
            .command_prefixes
            .iter()
            .any(|p| allows(p, &job.command))
        {
            return Err(ServiceError::PermissionDenied {
                message: format!(
                    "this server runs only commands starting with one of: {}",
                    self.command_prefixes
                        .iter()
                        .map(|p| format!("{p:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                field: Some("trial_job.command".into()),
            });
        }
        if let Some(name) = job.env.keys().find(|name| is_loader_variable(name)) {
            return Err(ServiceError::PermissionDenied {
                message: format!(
                    "{name} changes which program runs or what it loads: not settable while \
                     this server allows only some commands"
                ),
                field: Some(format!("trial_job.env.{name}")),
            });
        }
        Ok(())
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
}
