//! The CLI's HTTP client and the `study` subcommands.

use std::path::Path;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{ExportFormat, StudyCommand};

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    pub fn new(url: &str, token: Option<&str>) -> Result<Self, String> {
        let base = url.trim_end_matches('/').to_string();
        url::Url::parse(&base).map_err(|e| format!("invalid --url {url:?}: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        Ok(Self {
            http,
            base,
            token: token.map(str::to_string),
        })
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        let (status, value) = self.call_status(method, path, body).await?;
        if status.is_success() {
            Ok(value)
        } else {
            let err = &value["error"];
            let field = err["field"]
                .as_str()
                .map(|f| format!(" ({f})"))
                .unwrap_or_default();
            Err(format!(
                "{}{field}: {}",
                status.as_u16(),
                err["message"].as_str().unwrap_or("error")
            ))
        }
    }

    /// The status and JSON body (`null` when empty), errors included.
    pub async fn call_status(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), String> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| {
            if e.is_connect() || e.is_timeout() {
                format!("cannot reach the Augur server at {} (is `augur serve` running? set --url or AUGUR_URL)", self.base)
            } else {
                format!("request to {} failed: {e}", self.base)
            }
        })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("reading the server's answer: {e}"))?;
        if status == StatusCode::NO_CONTENT || text.is_empty() {
            return Ok((status, Value::Null));
        }
        match serde_json::from_str(&text) {
            Ok(value) => Ok((status, value)),
            // Logs and metrics are text.
            Err(_) if status.is_success() => Ok((status, Value::String(text))),
            Err(_) => Err(format!(
                "the server answered {status} with a body that is not JSON"
            )),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Every trial of a study, following pages.
    async fn all_trials(&self, id: i64) -> Result<Vec<Value>, String> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("/v1/studies/{id}/trials?page_size=1000");
            if let Some(t) = &token {
                path.push_str(&format!("&page_token={t}"));
            }
            let page = self.call(Method::GET, &path, None).await?;
            if let Some(trials) = page["trials"].as_array() {
                out.extend(trials.iter().cloned());
            }
            match page["next_page_token"].as_str() {
                Some(t) => token = Some(t.to_string()),
                None => return Ok(out),
            }
        }
    }
}

fn read_spec(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    if is_json {
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    } else {
        yaml_serde::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

pub async fn run_study_command(client: &Client, command: StudyCommand) -> Result<(), String> {
    match command {
        StudyCommand::Create { file } => {
            let spec = read_spec(&file)?;
            let study = client
                .call(Method::POST, "/v1/studies", Some(&spec))
                .await?;
            println!(
                "created study {} ({})",
                study["id"],
                study["name"].as_str().unwrap_or("")
            );
        }
        StudyCommand::List => {
            let mut token: Option<String> = None;
            println!(
                "{:>6}  {:<10}  {:<13}  {:>12}  name",
                "id", "state", "algorithm", "done/max"
            );
            loop {
                let path = match &token {
                    Some(t) => format!("/v1/studies?page_token={t}"),
                    None => "/v1/studies".to_string(),
                };
                let page = client.call(Method::GET, &path, None).await?;
                for s in page["studies"].as_array().into_iter().flatten() {
                    let c = &s["trial_counts"];
                    let done = c["completed"].as_u64().unwrap_or(0)
                        + c["infeasible"].as_u64().unwrap_or(0)
                        + c["failed"].as_u64().unwrap_or(0);
                    println!(
                        "{:>6}  {:<10}  {:<13}  {:>12}  {}",
                        s["id"],
                        s["state"].as_str().unwrap_or(""),
                        s["spec"]["algorithm"].as_str().unwrap_or(""),
                        format!("{done}/{}", s["spec"]["max_trials"]),
                        s["name"].as_str().unwrap_or("")
                    );
                }
                match page["next_page_token"].as_str() {
                    Some(t) => token = Some(t.to_string()),
                    None => break,
                }
            }
        }
        StudyCommand::Show { id } => print_json(
            &client
                .call(Method::GET, &format!("/v1/studies/{id}"), None)
                .await?,
        ),
        StudyCommand::Trials { id } => {
            for t in client.all_trials(id).await? {
                let metrics = t["final_measurement"]["metrics"].to_string();
                println!(
                    "{:>6}  {:<10}  {}  {}",
                    t["id"],
                    t["state"].as_str().unwrap_or(""),
                    t["parameters"],
                    if metrics == "null" {
                        String::new()
                    } else {
                        metrics
                    }
                );
            }
        }
        StudyCommand::Best { id } => print_json(
            &client
                .call(
                    Method::GET,
                    &format!("/v1/studies/{id}/optimal_trials"),
                    None,
                )
                .await?,
        ),
        StudyCommand::Stop { id } => {
            let s = client
                .call(Method::POST, &format!("/v1/studies/{id}/stop"), None)
                .await?;
            println!("study {id} is {}", s["state"].as_str().unwrap_or("?"));
        }
        StudyCommand::Export { id, format } => {
            let trials = client.all_trials(id).await?;
            match format {
                ExportFormat::Json => print_json(&Value::Array(trials)),
                ExportFormat::Csv => print!("{}", trials_csv(&trials)),
            }
        }
    }
    Ok(())
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
    let cell = |v: &Value| -> String {
        let s = match v {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s
        }
    };
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
