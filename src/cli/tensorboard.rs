//! `augur tensorboard STUDY`: TensorBoard over a dispatched study's trials.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clap::ValueEnum;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::client::Client;
use super::error::{CliError, CliResult};
use super::study::resolve_study;
use crate::model::{StudyId, TrialId};

/// The study's user attribute that names its running TensorBoard (the dashboard reads it).
pub const TENSORBOARD_URL_ATTR: &str = "augur:tensorboard_url";
/// What stands for a trial's id in the paths `GET /v1/studies/{study}/directories` gives.
const TRIAL_PLACEHOLDER: &str = "{trial}";
/// A run's name at most (a file name, with room to spare).
const MAX_RUN_NAME: usize = 200;

/// How runs are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RunNames {
    /// `trial-7`.
    Trial,
    /// `trial-7 learning_rate=0.01 units=64`.
    Values,
}

#[derive(Debug, clap::Args)]
pub struct TensorboardArgs {
    /// The study's id, or its name (the one active study of that name).
    pub study: String,
    /// TensorBoard's port.
    #[arg(long, default_value_t = 6006)]
    pub port: u16,
    /// The address TensorBoard listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The `tensorboard` program (`pip install tensorboard`, and
    /// `tensorboard-plugin-profile` for the profiler).
    #[arg(long, env = "AUGUR_TENSORBOARD", default_value = "tensorboard")]
    pub tensorboard: PathBuf,
    /// How runs are named.
    #[arg(long, value_enum, default_value_t = RunNames::Trial)]
    pub run_names: RunNames,
    /// Seconds between looks for new trials.
    #[arg(long, default_value_t = 10)]
    pub refresh_secs: u64,
    /// Keep the runs' links here (default: a directory of its own in the temporary
    /// directory, removed at exit).
    #[arg(long)]
    pub runs_dir: Option<PathBuf>,
    /// The address the dashboard links to (default `http://HOST:PORT/`), e.g. behind a proxy.
    #[arg(long)]
    pub public_url: Option<String>,
    /// Do not name this TensorBoard in the study's user attributes (the dashboard's link).
    #[arg(long)]
    pub no_link: bool,
}

/// Run TensorBoard over the study's trials until it exits or this command is interrupted.
///
/// `augur tensorboard STUDY`: TensorBoard over a dispatched study's trials. Each trial's
/// `AIP_TENSORBOARD_LOG_DIR` becomes a run named `trial-<id>` (or by its values): a link to
/// it in a directory of runs that TensorBoard reads as its `--logdir`, kept up to date as the
/// study starts trials (TensorBoard rescans it; a `--logdir_spec` is fixed when it starts).
/// While it runs, the study's user attribute `augur:tensorboard_url` names it, and the
/// dashboard's trial pages link to it.
pub async fn run_tensorboard(client: &Client, args: TensorboardArgs) -> CliResult<()> {
    let id = resolve_study(client, &args.study).await?;
    let dirs = client
        .call(Method::GET, &format!("/v1/studies/{id}/directories"), None)
        .await?;
    let template = dirs["tensorboard"]
        .as_str()
        .ok_or_else(|| CliError::Usage(format!("the server named no directories: {dirs}")))?
        .to_string();
    let (runs_dir, temporary) = match &args.runs_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "augur-tensorboard-study-{id}-{}",
                std::process::id()
            )),
            true,
        ),
    };
    std::fs::create_dir_all(&runs_dir).map_err(|e| CliError::file(&runs_dir, e))?;
    let mut runs = Runs {
        dir: runs_dir.clone(),
        template,
        names: args.run_names,
        linked: BTreeMap::new(),
    };
    runs.refresh(client, id).await?;
    let mut child = start(&args, &runs_dir)?;
    let url = args
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{}:{}/", args.host, args.port));
    eprintln!(
        "TensorBoard at {url} over study {id}'s trials ({} run(s) in {}); Ctrl-C stops it",
        runs.linked.len(),
        runs_dir.display()
    );
    let linked = !args.no_link && set_link(client, id, Some(&url)).await;
    let outcome = watch(client, id, &mut runs, &mut child, args.refresh_secs).await;
    if linked {
        set_link(client, id, None).await;
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&runs_dir);
    }
    outcome
}

/// Start TensorBoard over `runs_dir`.
fn start(args: &TensorboardArgs, runs_dir: &Path) -> CliResult<Child> {
    Command::new(&args.tensorboard)
        .arg("--logdir")
        .arg(runs_dir)
        .args(["--host", &args.host, "--port", &args.port.to_string()])
        // New runs show within seconds of their link.
        .args(["--reload_interval", "5"])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            CliError::Usage(format!(
                "cannot start {}: {e}. Install TensorBoard (`pip install tensorboard`, and \
                 `tensorboard-plugin-profile` for the profiler) or name it with --tensorboard",
                args.tensorboard.display()
            ))
        })
}

/// Keep the runs current until TensorBoard exits, or Ctrl-C or SIGTERM stop it.
async fn watch(
    client: &Client,
    id: StudyId,
    runs: &mut Runs,
    child: &mut Child,
    refresh_secs: u64,
) -> CliResult<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| CliError::Usage(format!("cannot watch for SIGTERM: {e}")))?;
    let mut tick = tokio::time::interval(Duration::from_secs(refresh_secs.max(1)));
    loop {
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(s) if s.success() => Ok(()),
                    Ok(s) => Err(CliError::Usage(format!("tensorboard exited: {s}"))),
                    Err(e) => Err(CliError::Usage(format!("tensorboard: {e}"))),
                };
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
            _ = tick.tick() => {
                // A server that does not answer for a while leaves the runs as they are.
                if let Err(e) = runs.refresh(client, id).await {
                    eprintln!("augur tensorboard: could not look for new trials: {e}");
                }
            }
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(())
}

/// The links to the trials' TensorBoard directories.
struct Runs {
    dir: PathBuf,
    /// A trial's directory, with `{trial}` for its id.
    template: String,
    names: RunNames,
    /// Trial id → its run's name.
    linked: BTreeMap<TrialId, String>,
}

impl Runs {
    /// Link the trials not linked yet (trial ids count from 1 within a study).
    async fn refresh(&mut self, client: &Client, id: StudyId) -> CliResult<()> {
        let study = client
            .call(Method::GET, &format!("/v1/studies/{id}"), None)
            .await?;
        let total = study["trial_counts"]["total"].as_i64().unwrap_or(0);
        if total <= self.linked.len() as i64 {
            return Ok(());
        }
        let names: Vec<(TrialId, String)> = match self.names {
            RunNames::Trial => (1..=total)
                .map(TrialId::new)
                .filter(|t| !self.linked.contains_key(t))
                .map(|t| (t, format!("trial-{t}")))
                .collect(),
            RunNames::Values => client
                .all_trials(id)
                .await?
                .iter()
                .filter_map(|t| Some((TrialId::new(t["id"].as_i64()?), t)))
                .filter(|(t, _)| !self.linked.contains_key(t))
                .map(|(t, trial)| (t, named_by_values(t, &trial["parameters"])))
                .collect(),
        };
        for (trial, name) in names {
            let target = self.template.replace(TRIAL_PLACEHOLDER, &trial.to_string());
            let link = self.dir.join(&name);
            match std::os::unix::fs::symlink(&target, &link) {
                Ok(()) => {}
                // Kept from an earlier run over the same `--runs-dir`.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(CliError::file(&link, e)),
            }
            self.linked.insert(trial, name);
        }
        Ok(())
    }
}

/// `trial-7 learning_rate=0.01 units=64`: a file name (no `/`, no NUL), at most
/// `MAX_RUN_NAME` bytes.
fn named_by_values(trial: TrialId, parameters: &Value) -> String {
    let mut name = format!("trial-{trial}");
    if let Some(values) = parameters.as_object() {
        for (k, v) in values {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            name.push_str(&format!(" {k}={v}"));
        }
    }
    let mut name: String = name
        .chars()
        .map(|c| if c == '/' || c == '\0' { '_' } else { c })
        .collect();
    if name.len() > MAX_RUN_NAME {
        let mut end = MAX_RUN_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// Name (or, with `None`, forget) this TensorBoard in the study's user attributes; false
/// when the caller may not (only the study's creator or an admin may change it).
async fn set_link(client: &Client, id: StudyId, url: Option<&str>) -> bool {
    let body = json!({ "user_attrs": { TENSORBOARD_URL_ATTR: url } });
    match client
        .call(Method::PATCH, &format!("/v1/studies/{id}"), Some(&body))
        .await
    {
        Ok(_) => true,
        Err(e) => {
            eprintln!("augur tensorboard: the dashboard will not link to it: {e}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_named_by_values_are_file_names() {
        let name = named_by_values(
            TrialId::new(7),
            &json!({"lr": 0.01, "opt": "a/b", "units": 64}),
        );
        assert_eq!(name, "trial-7 lr=0.01 opt=a_b units=64");
        let long = named_by_values(TrialId::new(3), &json!({"x": "é".repeat(300)}));
        assert!(long.len() <= MAX_RUN_NAME && long.starts_with("trial-3 x=é"));
    }
}
