//! `trial_job`: how the service itself runs each trial (DESIGN §2, §4), and how a trial's
//! values become its command line.

use std::collections::BTreeMap;

use augur_optimizer::{Assignment, Value};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ValidationError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorName {
    /// A child process of the service, in its own process group.
    #[default]
    Local,
    /// A Slurm batch job (`sbatch`), watched with `squeue`/`scontrol`.
    Slurm,
    /// Not available yet: rejected with a clear error.
    Kubernetes,
}

/// How parameter values are written on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ArgStyle {
    /// `--lr=0.01` (the default; what Vertex AI passes)
    #[default]
    Equals,
    /// `--lr 0.01` (two arguments)
    Space,
    /// `lr=0.01`
    KeyValue,
    /// `++lr=0.01` (Hydra: add or override)
    Hydra,
}

/// Options for the Slurm executor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlurmOptions {
    /// `--partition`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Further `sbatch` options, e.g. `["--gres=gpu:1", "--mem=8G"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sbatch_args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TrialJobSpec {
    #[serde(default)]
    pub executor: ExecutorName,
    /// The program and its fixed arguments. Values are appended as `--<id>=<value>` unless
    /// an argument is exactly `${args}` (replaced by them) or the arguments name values with
    /// `${<parameter id>}`, `${trial_id}`, `${params_file}` (a JSON file of the values).
    pub command: Vec<String>,
    #[serde(default)]
    pub arg_style: ArgStyle,
    /// Categorical parameters whose values are `"true"`/`"false"` become bare flags
    /// (`--fp16` when true, nothing when false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub boolean_flags: bool,
    /// Working directory of the job (default: the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// A run longer than this is killed (with its whole process group) and retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// Re-runs after a crash, timeout or lost node: same trial, same checkpoint directory.
    #[serde(default)]
    pub max_retries: u32,
    /// Base of the per-trial directories `<output_dir>/<trial>/{model,checkpoints,logs}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<String>,
    /// Regex for metrics printed on stdout, with groups `name` and `value`
    /// (default: Katib's `name=value`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric_regex: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmOptions>,
}

/// Variables of the server's (or worker's) own environment that every job inherits: what a
/// program needs to find its tools and speak the user's language, nothing that could hold a
/// secret (DESIGN §4). A job starts from these (and `LC_*`), its spec's `env`, the names the
/// server passes on (`--job-env`) and the variables Augur sets; never from the rest.
pub const INHERITED_ENV: [&str; 10] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
];

/// Whether a variable of the server's environment is one every job inherits.
pub fn is_inherited_env(name: &str) -> bool {
    INHERITED_ENV.contains(&name) || name.starts_with("LC_")
}

/// Katib's default stdout metric format: `accuracy=0.91` anywhere on a line.
pub const DEFAULT_METRIC_REGEX: &str =
    r"(?P<name>[A-Za-z_][\w.-]*)\s*=\s*(?P<value>[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)";

const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

impl TrialJobSpec {
    pub fn validate(&self) -> Result<(), ValidationError> {
        let field = |f: &str| format!("trial_job.{f}");
        if self.executor == ExecutorName::Kubernetes {
            return Err(ValidationError::new(
                field("executor"),
                "the kubernetes executor is not available yet; use local or slurm",
            ));
        }
        if self.command.is_empty() || self.command[0].trim().is_empty() {
            return Err(ValidationError::new(
                field("command"),
                "must name a program",
            ));
        }
        if self
            .timeout_secs
            .is_some_and(|t| t == 0 || t > MAX_TIMEOUT_SECS)
        {
            return Err(ValidationError::new(
                field("timeout_secs"),
                "must be between 1 and 31536000",
            ));
        }
        if self.max_retries > 100 {
            return Err(ValidationError::new(
                field("max_retries"),
                "must be at most 100",
            ));
        }
        for key in self.env.keys() {
            let ok = !key.is_empty()
                && !key.contains('=')
                && !key.contains('\0')
                && !key.starts_with("AUGUR_")
                && !key.starts_with("AIP_")
                && !key.starts_with("CLOUD_ML_");
            if !ok {
                return Err(ValidationError::new(
                    format!("trial_job.env.{key}"),
                    "not a valid variable name, or one Augur sets itself (AUGUR_*, AIP_*, CLOUD_ML_*)",
                ));
            }
        }
        if let Some(re) = &self.metric_regex {
            let compiled = regex::Regex::new(re).map_err(|e| {
                ValidationError::new(field("metric_regex"), format!("invalid regex: {e}"))
            })?;
            let names: Vec<&str> = compiled.capture_names().flatten().collect();
            if !names.contains(&"name") || !names.contains(&"value") {
                return Err(ValidationError::new(
                    field("metric_regex"),
                    "needs named groups `name` and `value`",
                ));
            }
        }
        if self.slurm.is_some() && self.executor != ExecutorName::Slurm {
            return Err(ValidationError::new(
                field("slurm"),
                "applies to executor: slurm only",
            ));
        }
        let sbatch_args = self.slurm.iter().flat_map(|s| s.sbatch_args.iter());
        if let Some(i) = sbatch_args.clone().position(|a| a.starts_with("--export")) {
            // `--export=ALL` would hand the server's environment (its token) to every job.
            return Err(ValidationError::new(
                field(&format!("slurm.sbatch_args[{i}]")),
                "--export is Augur's: jobs start from a clean environment; set variables in \
                 trial_job.env",
            ));
        }
        Ok(())
    }

    /// The argv of one trial: the command with placeholders filled in, and the values
    /// appended in `arg_style` unless placed by a placeholder. Never passes through a shell.
    pub fn render_argv(
        &self,
        parameters: &Assignment,
        trial_id: i64,
        params_file: &str,
    ) -> Vec<String> {
        let mut out = Vec::with_capacity(self.command.len() + parameters.len());
        let mut placed = false;
        for arg in &self.command {
            if arg == "${args}" {
                out.extend(self.value_args(parameters));
                placed = true;
                continue;
            }
            let (rendered, used) = substitute(arg, parameters, trial_id, params_file);
            placed |= used;
            out.push(rendered);
        }
        if !placed {
            out.extend(self.value_args(parameters));
        }
        out
    }

    fn value_args(&self, parameters: &Assignment) -> Vec<String> {
        let mut out = Vec::new();
        for (id, value) in parameters {
            let text = value_text(value);
            if self.boolean_flags && matches!(value, Value::Str(s) if s == "true" || s == "false") {
                if text == "true" {
                    out.push(match self.arg_style {
                        ArgStyle::Equals | ArgStyle::Space => format!("--{id}"),
                        ArgStyle::KeyValue => id.clone(),
                        ArgStyle::Hydra => format!("++{id}=true"),
                    });
                }
                continue;
            }
            match self.arg_style {
                ArgStyle::Equals => out.push(format!("--{id}={text}")),
                ArgStyle::Space => {
                    out.push(format!("--{id}"));
                    out.push(text);
                }
                ArgStyle::KeyValue => out.push(format!("{id}={text}")),
                ArgStyle::Hydra => out.push(format!("++{id}={text}")),
            }
        }
        out
    }
}

/// A value as a command-line word: integers without a point, floats in shortest form,
/// categoricals as given.
pub fn value_text(value: &Value) -> String {
    match value {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Str(s) => s.clone(),
    }
}

/// Replace `${id}`, `${trial_id}` and `${params_file}` in one argument. Returns whether a
/// parameter value or the params file was placed (then values are not appended).
fn substitute(
    arg: &str,
    parameters: &Assignment,
    trial_id: i64,
    params_file: &str,
) -> (String, bool) {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    let mut used = false;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            rest = "";
            break;
        };
        let name = &after[..end];
        match name {
            "trial_id" => out.push_str(&trial_id.to_string()),
            "params_file" => {
                out.push_str(params_file);
                used = true;
            }
            // An inactive conditional parameter's placeholder becomes empty.
            _ => {
                if let Some(v) = parameters.get(name) {
                    out.push_str(&value_text(v));
                    used = true;
                }
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    (out, used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(command: &[&str]) -> TrialJobSpec {
        TrialJobSpec {
            executor: ExecutorName::Local,
            command: command.iter().map(|s| s.to_string()).collect(),
            arg_style: ArgStyle::Equals,
            boolean_flags: false,
            workdir: None,
            env: BTreeMap::new(),
            timeout_secs: None,
            max_retries: 0,
            output_dir: None,
            metric_regex: None,
            slurm: None,
        }
    }

    fn params() -> Assignment {
        [
            ("lr".to_string(), Value::Float(0.01)),
            ("layers".to_string(), Value::Int(3)),
            ("opt".to_string(), Value::Str("adam w".to_string())),
            ("fp16".to_string(), Value::Str("true".to_string())),
            ("ema".to_string(), Value::Str("false".to_string())),
        ]
        .into()
    }

    #[test]
    fn default_appends_equals_args_in_id_order_without_a_shell() {
        let argv = job(&["python3", "train.py"]).render_argv(&params(), 7, "/p.json");
        assert_eq!(
            argv,
            [
                "python3",
                "train.py",
                "--ema=false",
                "--fp16=true",
                "--layers=3",
                "--lr=0.01",
                "--opt=adam w"
            ]
        );
    }

    #[test]
    fn styles_and_boolean_flags() {
        let mut j = job(&["t"]);
        j.arg_style = ArgStyle::Space;
        j.boolean_flags = true;
        assert_eq!(
            j.render_argv(&params(), 1, ""),
            [
                "t", "--fp16", "--layers", "3", "--lr", "0.01", "--opt", "adam w"
            ]
        );
        j.arg_style = ArgStyle::KeyValue;
        j.boolean_flags = false;
        assert_eq!(j.render_argv(&params(), 1, "")[1], "ema=false");
        j.arg_style = ArgStyle::Hydra;
        assert_eq!(j.render_argv(&params(), 1, "")[3], "++layers=3");
    }

    #[test]
    fn placeholders_place_values_and_args() {
        let j = job(&["run", "--learning-rate", "${lr}", "--name=t${trial_id}"]);
        assert_eq!(
            j.render_argv(&params(), 12, ""),
            ["run", "--learning-rate", "0.01", "--name=t12"]
        );
        let j = job(&["run", "${args}", "--", "x"]);
        assert_eq!(j.render_argv(&params(), 1, "")[1], "--ema=false");
        assert_eq!(
            j.render_argv(&params(), 1, "").last().map(String::as_str),
            Some("x")
        );
        let j = job(&["run", "--config", "${params_file}"]);
        assert_eq!(
            j.render_argv(&params(), 1, "/runs/1/params.json"),
            ["run", "--config", "/runs/1/params.json"]
        );
    }

    #[test]
    fn validation_names_fields() {
        let mut j = job(&[]);
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.command".to_string())
        );
        j = job(&["x"]);
        j.env.insert("AIP_MODEL_DIR".into(), "x".into());
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.env.AIP_MODEL_DIR".to_string())
        );
        j = job(&["x"]);
        j.metric_regex = Some("(?P<name>\\w+)".into());
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.metric_regex".to_string())
        );
        j = job(&["x"]);
        j.executor = ExecutorName::Slurm;
        j.slurm = Some(SlurmOptions {
            partition: None,
            sbatch_args: vec!["--mem=1G".into(), "--export=ALL".into()],
        });
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.slurm.sbatch_args[1]".to_string())
        );
        j = job(&["x"]);
        j.executor = ExecutorName::Kubernetes;
        assert_eq!(
            j.validate().map_err(|e| e.field),
            Err("trial_job.executor".to_string())
        );
    }
}
