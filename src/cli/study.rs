//! `augur study …`: create, list, show, trials, best, export, stop, through the HTTP API.

use std::path::Path;

use reqwest::Method;
use serde_json::Value;

use super::client::Client;
use super::error::{CliError, CliResult};
use super::{ExportFormat, StudyCommand};
use crate::model::{StudyId, TrialId};

/// A spec file as JSON (`.json`) or YAML (anything else).
pub(super) fn read_spec(path: &Path) -> CliResult<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| CliError::file(path, e))?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    if is_json {
        serde_json::from_str(&text).map_err(|e| CliError::file(path, e))
    } else {
        yaml_serde::from_str(&text).map_err(|e| CliError::file(path, e))
    }
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// A study named on the command line: its id, or its name, which must be that of exactly
/// one active study (several studies may share a name over time).
pub async fn resolve_study(client: &Client, study: &str) -> CliResult<StudyId> {
    if let Ok(id) = study.parse::<StudyId>() {
        return Ok(id);
    }
    let path = format!(
        "/v1/studies?state=active&page_size=1000&name={}",
        url::form_urlencoded::byte_serialize(study.as_bytes()).collect::<String>()
    );
    let found = client.call(Method::GET, &path, None).await?;
    let ids: Vec<StudyId> = found["studies"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|s| s["name"].as_str() == Some(study))
        .filter_map(|s| s["id"].as_i64().map(StudyId::new))
        .collect();
    match ids.as_slice() {
        [id] => Ok(*id),
        [] => Err(CliError::Usage(format!(
            "no active study is named {}: give its id (augur study list)",
            printable(study)
        ))),
        several => Err(CliError::Usage(format!(
            "{} active studies are named {}: give one of their ids ({})",
            several.len(),
            printable(study),
            several
                .iter()
                .map(StudyId::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// What a trial came to, for one column: its final metrics, or why it failed or was
/// infeasible.
fn outcome(trial: &Value) -> String {
    let metrics = &trial["final_measurement"]["metrics"];
    if let Some(reason) = trial["fail_reason"].as_str() {
        format!("failed: {reason}")
    } else if let Some(reason) = trial["infeasible_reason"].as_str() {
        format!("infeasible: {reason}")
    } else if metrics.is_object() {
        metrics.to_string()
    } else {
        String::new()
    }
}

/// The best trials (`optimal_trials`' answer) of `study` as lines: id, metrics, values and,
/// for a study the server dispatches, the trial's model directory (relative ones are
/// relative to the server's directory).
fn best_table(study: &Value, best: &Value) -> String {
    let trials = best["trials"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if trials.is_empty() {
        return "no completed trial yet\n".to_string();
    }
    let job: Option<crate::model::TrialJobSpec> =
        serde_json::from_value(study["spec"]["trial_job"].clone()).ok();
    let key = study["created_at"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .zip(study["id"].as_i64().map(StudyId::new))
        .map(|(created_at, id)| crate::model::StudyKey { id, created_at });
    let mut out = String::new();
    for t in trials {
        out.push_str(&format!(
            "best trial {}: {} with {}\n",
            t["id"], t["final_measurement"]["metrics"], t["parameters"]
        ));
        if let (Some(job), Some(key), Some(trial)) = (&job, key, t["id"].as_i64().map(TrialId::new))
        {
            let dir = crate::model::StudyDir::of(std::path::Path::new(""), key, Some(job));
            let dirs = crate::model::TrialDirs::new(&dir, trial);
            out.push_str(&format!(
                "  model: {}\n",
                printable(&dirs.model.display().to_string())
            ));
        }
    }
    out
}

pub async fn run_study_command(client: &Client, command: StudyCommand) -> CliResult<()> {
    match command {
        StudyCommand::Create {
            file,
            dry_run: true,
        }
        | StudyCommand::Validate { file } => {
            print!("{}", super::validate::validate_file(&file)?);
        }
        StudyCommand::Create {
            file,
            dry_run: false,
        } => create_study(client, &file).await?,
        StudyCommand::List => list_studies(client).await?,
        StudyCommand::Show { id } => print_json(
            &client
                .call(Method::GET, &format!("/v1/studies/{id}"), None)
                .await?,
        ),
        StudyCommand::Trials { id, json: true } => {
            print_json(&Value::Array(client.all_trials(id).await?))
        }
        StudyCommand::Trials { id, json: false } => {
            print!("{}", trials_table(&client.all_trials(id).await?));
        }
        StudyCommand::Best { id, json } => {
            let best = client
                .call(
                    Method::GET,
                    &format!("/v1/studies/{id}/optimal_trials"),
                    None,
                )
                .await?;
            if json {
                print_json(&best);
            } else {
                let study = client
                    .call(Method::GET, &format!("/v1/studies/{id}"), None)
                    .await?;
                print!("{}", best_table(&study, &best));
            }
        }
        StudyCommand::Delete { id } => {
            client
                .call(Method::DELETE, &format!("/v1/studies/{id}"), None)
                .await?;
            println!("deleted study {id}");
        }
        StudyCommand::Stop { id } => {
            let s = client
                .call(Method::POST, &format!("/v1/studies/{id}/stop"), None)
                .await?;
            println!("study {id} is {}", s["state"].as_str().unwrap_or("?"));
        }
        StudyCommand::Resume { id } => {
            let s = client
                .call(Method::POST, &format!("/v1/studies/{id}/resume"), None)
                .await?;
            println!("study {id} is {}", s["state"].as_str().unwrap_or("?"));
        }
        StudyCommand::Export { id, format } => match format {
            ExportFormat::Json => print_json(&Value::Array(client.all_trials(id).await?)),
            ExportFormat::Csv => print!("{}", trials_csv(&client.all_trials(id).await?)),
            ExportFormat::Vertex => {
                let study = client
                    .call(Method::GET, &format!("/v1/studies/{id}"), None)
                    .await?;
                let spec: crate::model::StudySpec = serde_json::from_value(study["spec"].clone())
                    .map_err(|e| {
                    CliError::Connection(format!("unexpected study document: {e}"))
                })?;
                print_json(&crate::model::vertex::to_vertex(&spec));
            }
        },
    }
    Ok(())
}

/// `augur study create -f FILE`.
async fn create_study(client: &Client, file: &std::path::Path) -> CliResult<()> {
    let spec = read_spec(file)?;
    // A Vertex AI job is sent as it is; what the server will ignore of it is shown here.
    if crate::model::vertex::is_vertex_job(&spec)
        && let Ok(imported) = crate::model::vertex::from_vertex(&spec)
    {
        for warning in imported.warnings {
            eprintln!("warning: {warning}");
        }
    }
    let study = client
        .call(Method::POST, "/v1/studies", Some(&spec))
        .await?;
    println!(
        "created study {} ({})",
        study["id"],
        printable(study["name"].as_str().unwrap_or(""))
    );
    Ok(())
}

/// `augur study list`: every study, one line each, page by page.
async fn list_studies(client: &Client) -> CliResult<()> {
    let mut token: Option<String> = None;
    let mut header = true;
    loop {
        let path = match &token {
            Some(t) => format!("/v1/studies?page_token={t}"),
            None => "/v1/studies".to_string(),
        };
        // The header once the server answered: not above a connection error.
        let page = client.call(Method::GET, &path, None).await?;
        if std::mem::take(&mut header) {
            println!(
                "{:>6}  {:<10}  {:<13}  {:>12}  name",
                "id", "state", "algorithm", "done/max"
            );
        }
        for s in page["studies"].as_array().into_iter().flatten() {
            let c = &s["trial_counts"];
            let done = c["completed"].as_u64().unwrap_or(0)
                + c["infeasible"].as_u64().unwrap_or(0)
                + c["failed"].as_u64().unwrap_or(0);
            // Numbers, not JSON values: a value's Display ignores the width.
            println!(
                "{:>6}  {:<10}  {:<13}  {:>12}  {}",
                s["id"].as_i64().unwrap_or_default(),
                s["state"].as_str().unwrap_or(""),
                s["spec"]["algorithm"].as_str().unwrap_or(""),
                format!("{done}/{}", s["spec"]["max_trials"]),
                printable(s["name"].as_str().unwrap_or(""))
            );
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => return Ok(()),
        }
    }
}

/// `augur study trials`'s table: id, state, outcome and values of each trial.
fn trials_table(trials: &[Value]) -> String {
    let mut table = format!(
        "{:>6}  {:<10}  {:<40}  parameters\n",
        "id", "state", "outcome"
    );
    for t in trials {
        table.push_str(&format!(
            "{:>6}  {:<10}  {:<40}  {}\n",
            t["id"].as_i64().unwrap_or_default(),
            t["state"].as_str().unwrap_or(""),
            printable(&outcome(t)),
            t["parameters"],
        ));
    }
    table
}

/// `augur audit`: the whole trail, oldest first, one line per entry.
pub async fn print_audit(client: &Client) -> CliResult<()> {
    let mut token: Option<String> = None;
    loop {
        let path = match &token {
            Some(t) => format!("/v1/audit?page_size=1000&page_token={t}"),
            None => "/v1/audit?page_size=1000".to_string(),
        };
        let page = client.call(Method::GET, &path, None).await?;
        for e in page["events"].as_array().into_iter().flatten() {
            let mut line = format!(
                "{}  {}  {}",
                e["at"].as_str().unwrap_or(""),
                printable(e["actor"].as_str().unwrap_or("")),
                e["action"].as_str().unwrap_or("")
            );
            if let Some(study) = e["study_id"].as_i64() {
                line.push_str(&format!("  study {study}"));
            }
            if let Some(trial) = e["trial_id"].as_i64() {
                line.push_str(&format!("  trial {trial}"));
            }
            if let Some(detail) = e["detail"].as_str() {
                line.push_str(&format!("  {}", printable(detail)));
            }
            println!("{line}");
        }
        match page["next_page_token"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => return Ok(()),
        }
    }
}

/// One row per trial: id, state, every parameter, every final metric.
fn trials_csv(trials: &[Value]) -> String {
    let keys = |field: &str| -> Vec<String> {
        let mut set = std::collections::BTreeSet::new();
        for t in trials {
            let obj = if field == "metrics" {
                &t["final_measurement"]["metrics"]
            } else {
                &t[field]
            };
            if let Some(o) = obj.as_object() {
                set.extend(o.keys().cloned());
            }
        }
        set.into_iter().collect()
    };
    let params = keys("parameters");
    let metrics = keys("metrics");
    let cell = super::csv::csv_cell;
    let mut out = String::from("id,state");
    for p in &params {
        out.push_str(&format!(",{}", cell(&Value::String(p.clone()))));
    }
    for m in &metrics {
        out.push_str(&format!(",{}", cell(&Value::String(m.clone()))));
    }
    out.push('\n');
    for t in trials {
        out.push_str(&format!("{},{}", t["id"], cell(&t["state"])));
        for p in &params {
            out.push_str(&format!(",{}", cell(&t["parameters"][p])));
        }
        for m in &metrics {
            out.push_str(&format!(",{}", cell(&t["final_measurement"]["metrics"][m])));
        }
        out.push('\n');
    }
    out
}

/// A value for a terminal: control characters (escape sequences, NUL, line breaks, C1
/// controls) escaped as `\u{1b}`, `\n`, …, so a stored name cannot forge rows or drive the
/// terminal (names are refused with them at validation now; older versions stored them);
/// and the invisible characters that reorder or hide text (bidirectional overrides and
/// isolates, zero-width ones) escaped as `\u{202e}`, so a line shows what is stored:
/// `report\u{202e}fdp.exe` rather than a name that reads as another (Trojan Source).
pub(super) fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else if is_invisible_format(c) {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Unicode format characters a terminal draws as nothing while they change what is shown:
/// bidirectional marks, embeddings, overrides and isolates, zero-width (non-)joiners and
/// spaces, invisible operators, the byte-order mark, the soft hyphen, interlinear
/// annotations.
fn is_invisible_format(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_has_a_row_per_trial_with_every_parameter_and_metric() {
        let csv = trials_csv(&[serde_json::json!({
            "id": 1, "state": "completed",
            "parameters": {"opt": "@SUM(A1)", "x": -2.5},
            "final_measurement": {"metrics": {"loss": -0.5}}
        })]);
        assert_eq!(
            csv,
            "id,state,opt,x,loss\n1,completed,\"'@SUM(A1)\",-2.5,-0.5\n"
        );
    }

    #[test]
    fn control_characters_print_escaped() {
        assert_eq!(printable("a\u{1b}[31mb\nc\0"), "a\\u{1b}[31mb\\nc\\u{0}");
        assert_eq!(printable("svc-digits é"), "svc-digits é");
        assert_eq!(
            printable("a\u{202e}b\u{200b}c\u{2066}d\u{feff}"),
            "a\\u{202e}b\\u{200b}c\\u{2066}d\\u{feff}"
        );
    }
}
