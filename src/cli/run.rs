//! `augur run -f study.yaml`: the whole thing on one machine. Starts an embedded server
//! (SQLite by default), creates the study (or resumes the same study from an earlier run),
//! runs its trials with the local executor while drawing progress, and prints the best trial
//! and where its model is. Ctrl-C stops the jobs; running the same command again resumes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use super::error::{CliError, CliResult};
use crate::app::{App, ServerConfig};
use crate::model::{
    MetricGoal, Study, StudyDir, StudyId, StudyKey, StudySpec, StudyState, TrialDirs, TrialState,
};
use crate::service::Service;

/// How `augur run` ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The study is no longer active: completed, or stopped through the API.
    Finished,
    /// Ctrl-C: the study is left to resume.
    Interrupted,
}

/// How long `augur run` waits, once its study ended, for its webhooks to be delivered.
const NOTIFY_GRACE: std::time::Duration = std::time::Duration::from_secs(15);

/// What `augur run` passes on to its embedded server.
pub struct RunOptions {
    /// Variables of this environment passed on to every trial.
    pub job_env: Vec<String>,
    pub executors: crate::dispatch::settings::ExecutorSettings,
    /// Webhooks (`--notify-*`).
    pub notify: crate::app::NotifyConfig,
}

pub async fn run_study_file(
    file: &Path,
    database_url: &str,
    options: RunOptions,
) -> CliResult<RunEnd> {
    let RunOptions {
        job_env,
        executors,
        notify,
    } = options;
    // Relative paths in the spec (and trial directories) are the spec file's neighbours.
    let base_dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
    .canonicalize()
    .map_err(|e| CliError::file(file, e))?;
    let spec = read_spec(file)?;
    if spec.trial_job.is_none() {
        return Err(CliError::file(
            file,
            "`augur run` needs a trial_job (the command that trains one trial); see examples/quickstart/study.yaml",
        ));
    }
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let mut config = ServerConfig::new(database_url, listen);
    config.base_dir = Some(base_dir.clone());
    config.job_env = job_env;
    config.executors = executors;
    config.notify = notify;
    let app = App::build(config).await?;
    let service = app.service().clone();
    let actor = crate::service::Caller::local("cli:run");
    let (study, resumed) = service.find_or_create_study(&actor, spec).await?;
    if resumed {
        eprintln!("resuming study {} from an earlier run", study.id);
    }
    let key = StudyKey {
        id: study.id,
        created_at: study.created_at,
    };
    let study_dir = StudyDir::of(&base_dir, key, study.spec.trial_job.as_ref());
    eprintln!(
        "study {} ({}): {} trials, {} at a time; trial directories in {}",
        study.id,
        study.name,
        study.spec.max_trials,
        study.spec.parallel_trials,
        study_dir.dir.display()
    );

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async move {
        let _ = stop_rx.await;
    }));
    let interrupted = follow_progress(&service, &study).await?;
    let _ = stop_tx.send(());
    let _ = server.await;
    // The study's last webhooks (its completion) go out before the process ends.
    if !service.settle_notifications(NOTIFY_GRACE).await {
        eprintln!(
            "some notifications were not delivered within {} s",
            NOTIFY_GRACE.as_secs()
        );
    }
    let study = service.get_study(study.id).await?;
    print_outcome(&service, &study, &study_dir, interrupted).await?;
    if study.state == StudyState::Failed {
        let reason = study
            .state_reason
            .unwrap_or_else(|| "the study failed".into());
        return Err(CliError::StudyFailed(reason));
    }
    // A study that ran out of trials with none completed did not do its job either.
    let c = &study.trial_counts;
    if !interrupted && study.state == StudyState::Completed && c.completed == 0 {
        return Err(CliError::StudyFailed(format!(
            "no trial completed ({} failed, {} infeasible): see the reasons above",
            c.failed, c.infeasible
        )));
    }
    Ok(if interrupted {
        RunEnd::Interrupted
    } else {
        RunEnd::Finished
    })
}

/// Draw the study's progress until it is no longer active (false) or Ctrl-C (true).
async fn follow_progress(service: &Service, study: &Study) -> CliResult<bool> {
    let bar = ProgressBar::new(study.spec.max_trials.max(0) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} done, {msg} [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // One listener for the whole run: a fresh `ctrl_c()` per turn would miss a Ctrl-C
    // that arrives while the study is being read.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut failures_shown = 0;
    let interrupted = loop {
        tokio::select! {
            _ = &mut ctrl_c => break true,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let current = service.get_study(study.id).await?;
        if current.trial_counts.failed > failures_shown {
            failures_shown = show_failures(service, study.id, &bar, failures_shown).await?;
        }
        draw(&bar, &current);
        if current.state != StudyState::Active {
            break false;
        }
    };
    bar.finish_and_clear();
    Ok(interrupted)
}

/// Print, above the bar, why each failed trial after the first `shown` failed (in the order
/// they are listed); returns how many failed trials there are now.
async fn show_failures(
    service: &Service,
    study_id: StudyId,
    bar: &ProgressBar,
    shown: u64,
) -> CliResult<u64> {
    let mut failed = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = service
            .list_trials(
                study_id,
                Some(TrialState::Failed),
                Some(1000),
                token.as_deref(),
            )
            .await?;
        failed.extend(page.items);
        match page.next_page_token {
            Some(next) => token = Some(next),
            None => break,
        }
    }
    for trial in failed.iter().skip(shown as usize) {
        let reason = trial.fail_reason.as_deref().unwrap_or("no reason given");
        // Above the bar on a terminal; as plain lines when stderr is not one (the bar is
        // hidden there, and its `println` too).
        bar.suspend(|| {
            eprintln!(
                "trial {} failed: {}",
                trial.id,
                super::study::printable(reason)
            )
        });
    }
    Ok(failed.len() as u64)
}

/// The closing lines: counts, and the best trial(s) with their model directories.
async fn print_outcome(
    service: &Service,
    study: &Study,
    study_dir: &StudyDir,
    interrupted: bool,
) -> CliResult<()> {
    let c = &study.trial_counts;
    println!(
        "study {} {}: {} completed, {} infeasible, {} failed of {} trials",
        study.id,
        study.state.as_str(),
        c.completed,
        c.infeasible,
        c.failed,
        study.spec.max_trials
    );
    if interrupted {
        println!("stopped; run the same command again to resume");
    }
    for trial in service.optimal_trials(study.id).await? {
        let metrics = trial
            .final_measurement
            .as_ref()
            .map(|m| serde_json::to_string(&m.metrics).unwrap_or_default())
            .unwrap_or_default();
        println!(
            "best trial {}: {metrics} with {}",
            trial.id,
            serde_json::to_string(&trial.parameters).unwrap_or_default()
        );
        let dirs = TrialDirs::new(study_dir, trial.id);
        println!("  model: {}", dirs.model.display());
    }
    Ok(())
}

fn draw(bar: &ProgressBar, study: &Study) {
    let c = &study.trial_counts;
    bar.set_position(c.completed + c.infeasible + c.failed);
    let best = study.best_trial.as_ref().and_then(|t| {
        let metric = study.spec.metrics.first()?;
        let v = t.final_measurement.as_ref()?.metrics.get(&metric.id)?;
        let word = if metric.goal == MetricGoal::Maximize {
            "max"
        } else {
            "min"
        };
        Some(format!(
            ", best {} ({word}) {v:.6} (trial {})",
            metric.id, t.id
        ))
    });
    bar.set_message(format!(
        "{} running, {} failed{}",
        c.active + c.requested + c.stopping,
        c.failed,
        best.unwrap_or_default()
    ));
}

/// The spec file, with relative `workdir`/`output_dir` resolved against its directory.
fn read_spec(file: &Path) -> CliResult<StudySpec> {
    let mut value = super::study::read_spec(file)?;
    let base = file.parent().unwrap_or(Path::new("."));
    if let Some(job) = value.get_mut("trial_job").and_then(Value::as_object_mut) {
        for key in ["workdir", "output_dir"] {
            if let Some(Value::String(p)) = job.get(key) {
                let path = PathBuf::from(p);
                if path.is_relative() {
                    let joined = base.join(path);
                    let absolute = std::path::absolute(&joined).unwrap_or(joined);
                    job.insert(
                        key.to_string(),
                        Value::String(absolute.display().to_string()),
                    );
                }
            }
        }
    }
    let spec: StudySpec = serde_path_to_error::deserialize(value)
        .map_err(|e| CliError::file(file, format!("{}: {}", e.path(), e.inner())))?;
    spec.validate().map_err(|e| CliError::file(file, e))?;
    Ok(spec)
}
