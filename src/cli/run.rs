//! `augur run -f study.yaml`: the whole thing on one machine. Starts an embedded server
//! (SQLite by default), creates the study (or resumes the same study from an earlier run),
//! runs its trials with the local executor while drawing progress, and prints the best trial
//! and where its model is. Ctrl-C stops the jobs; running the same command again resumes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use crate::app::{App, ServerConfig};
use crate::model::{MetricGoal, Study, StudySpec, StudyState};
use crate::service::Service;

/// How `augur run` ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The study is no longer active: completed, or stopped through the API.
    Finished,
    /// Ctrl-C: the study is left to resume.
    Interrupted,
}

pub async fn run_study_file(
    file: &Path,
    database_url: &str,
    job_env: Vec<String>,
) -> Result<RunEnd, String> {
    let base_dir = file
        .parent()
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .unwrap_or(Path::new("."))
        .canonicalize()
        .map_err(|e| format!("{}: {e}", file.display()))?;
    let spec = read_spec(file)?;
    if spec.trial_job.is_none() {
        return Err(format!(
            "{}: `augur run` needs a trial_job (the command that trains one trial); see examples/quickstart/study.yaml",
            file.display()
        ));
    }
    let mut config = ServerConfig::new(
        database_url,
        "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
    );
    config.base_dir = Some(base_dir.clone());
    config.job_env = job_env;
    let app = App::build(config).await.map_err(|e| e.to_string())?;
    let service = app.service().clone();
    let study = find_or_create(&service, spec).await?;
    let study_id = study.id;
    let job = study
        .spec
        .trial_job
        .clone()
        .ok_or("the study has no trial_job")?;
    let output_dir = crate::dispatch::runner::output_dir(
        &crate::dispatch::DispatchConfig {
            augur_url: String::new(),
            base_dir,
            owner: String::new(),
            job_env: Vec::new(),
        },
        study_id,
        job.output_dir.as_deref(),
    );
    eprintln!(
        "study {study_id} ({}): {} trials, {} at a time; trial directories in {}",
        study.name,
        study.spec.max_trials,
        study.spec.parallel_trials,
        output_dir.display()
    );

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until(async move {
        let _ = stop_rx.await;
    }));
    let bar = ProgressBar::new(study.spec.max_trials.max(0) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} done, {msg} [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let interrupted = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break true,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let current = service
            .get_study(study_id)
            .await
            .map_err(|e| e.to_string())?;
        draw(&bar, &current);
        if current.state != StudyState::Active {
            break false;
        }
    };
    let _ = stop_tx.send(());
    let _ = server.await;
    bar.finish_and_clear();
    let study = service
        .get_study(study_id)
        .await
        .map_err(|e| e.to_string())?;
    let c = &study.trial_counts;
    println!(
        "study {study_id} {}: {} completed, {} infeasible, {} failed of {} trials",
        study.state.as_str(),
        c.completed,
        c.infeasible,
        c.failed,
        study.spec.max_trials
    );
    if interrupted {
        println!("stopped; run the same command again to resume");
    }
    let best = service
        .optimal_trials(study_id)
        .await
        .map_err(|e| e.to_string())?;
    for trial in best {
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
        println!(
            "  model: {}",
            output_dir
                .join(trial.id.to_string())
                .join("model")
                .display()
        );
    }
    if study.state == StudyState::Failed {
        return Err(study
            .state_reason
            .unwrap_or_else(|| "the study failed".into()));
    }
    Ok(if interrupted {
        RunEnd::Interrupted
    } else {
        RunEnd::Finished
    })
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

/// The same study from an earlier `augur run` of this file (same name and spec), or a new one.
async fn find_or_create(service: &Service, spec: StudySpec) -> Result<Study, String> {
    let mut token: Option<String> = None;
    loop {
        let page = service
            .list_studies(None, Some(&spec.name), Some(100), token.as_deref())
            .await
            .map_err(|e| e.to_string())?;
        for study in page.items {
            let mut stored = study.spec.clone();
            if spec.seed.is_none() {
                stored.seed = None;
            }
            if stored == spec && matches!(study.state, StudyState::Active | StudyState::Completed) {
                eprintln!("resuming study {} from an earlier run", study.id);
                return Ok(study);
            }
        }
        match page.next_page_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    service.create_study(spec).await.map_err(|e| e.to_string())
}

/// The spec file, with relative `workdir`/`output_dir` resolved against its directory.
fn read_spec(file: &Path) -> Result<StudySpec, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let mut value: Value = if file.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?
    } else {
        yaml_serde::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?
    };
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
        .map_err(|e| format!("{}: {}: {}", file.display(), e.path(), e.inner()))?;
    spec.validate()
        .map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(spec)
}
