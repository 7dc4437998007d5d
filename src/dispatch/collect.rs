//! Metrics a job reports without HTTP: the JSON lines the `cloudml-hypertune` package writes
//! to `CLOUD_ML_HP_METRIC_FILE`, and `name=value` lines on stdout. Pure parsing, no IO.

use std::collections::BTreeMap;

use regex::Regex;

use crate::model::Measurement;

/// The tag `cloudml-hypertune` uses when the caller names none.
const DEFAULT_HYPERTUNE_TAG: &str = "training/hptuning/metric";
/// Keys of a hypertune line that are not metrics.
const HYPERTUNE_FIELDS: [&str; 4] = ["timestamp", "trial", "global_step", "checkpoint_path"];
/// Names on a stdout line that give the step rather than a metric.
const STEP_NAMES: [&str; 3] = ["step", "global_step", "epoch"];

/// Parse the whole hypertune file (it is rewritten whole, last 100 entries). Each entry's
/// string-typed values become metric values at its `global_step`; only the study's metrics
/// are kept, and the default tag stands for the study's first metric. Entries at one step
/// merge. Unparseable lines are skipped: the file may be caught mid-write.
pub fn parse_hypertune(text: &str, metric_ids: &[String]) -> Vec<Measurement> {
    let mut by_step: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    for line in text.lines() {
        let Ok(serde_json::Value::Object(entry)) = serde_json::from_str::<serde_json::Value>(line)
        else {
            continue;
        };
        let step = entry
            .get("global_step")
            .and_then(|v| {
                v.as_str()
                    .map(str::to_string)
                    .or_else(|| v.as_i64().map(|i| i.to_string()))
            })
            .and_then(|s| s.parse::<i64>().ok())
            .unwrap_or(0)
            .max(0);
        for (key, value) in &entry {
            if HYPERTUNE_FIELDS.contains(&key.as_str()) {
                continue;
            }
            let name = if key == DEFAULT_HYPERTUNE_TAG {
                match metric_ids.first() {
                    Some(first) => first.clone(),
                    None => continue,
                }
            } else {
                key.clone()
            };
            if !metric_ids.contains(&name) {
                continue;
            }
            let number = value
                .as_str()
                .and_then(|s| s.trim().parse::<f64>().ok())
                .or_else(|| value.as_f64());
            if let Some(x) = number.filter(|x| x.is_finite()) {
                by_step.entry(step).or_default().insert(name, x);
            }
        }
    }
    by_step
        .into_iter()
        .map(|(step, metrics)| Measurement {
            step,
            elapsed_secs: None,
            metrics,
        })
        .collect()
}

/// Reads metric lines from a job's stdout.
pub struct StdoutMetrics {
    pattern: Regex,
    metric_ids: Vec<String>,
    /// Steps for lines that name none: 1, 2, 3, …
    lines_with_metrics: i64,
}

impl StdoutMetrics {
    pub fn new(pattern: &str, metric_ids: Vec<String>) -> Result<Self, regex::Error> {
        Ok(Self::with_pattern(Regex::new(pattern)?, metric_ids))
    }

    /// With a pattern compiled once for many jobs.
    pub fn with_pattern(pattern: Regex, metric_ids: Vec<String>) -> Self {
        Self {
            pattern,
            metric_ids,
            lines_with_metrics: 0,
        }
    }

    /// The measurement on this line, if it reports any of the study's metrics. A `step`,
    /// `global_step` or `epoch` on the same line gives its step.
    pub fn parse_line(&mut self, line: &str) -> Option<Measurement> {
        let mut metrics = BTreeMap::new();
        let mut step = None;
        for caps in self.pattern.captures_iter(line) {
            let (Some(name), Some(value)) = (caps.name("name"), caps.name("value")) else {
                continue;
            };
            let Ok(x) = value.as_str().parse::<f64>() else {
                continue;
            };
            if STEP_NAMES.contains(&name.as_str()) {
                step = Some(x as i64);
            } else if self.metric_ids.iter().any(|m| m == name.as_str()) && x.is_finite() {
                metrics.insert(name.as_str().to_string(), x);
            }
        }
        if metrics.is_empty() {
            return None;
        }
        self.lines_with_metrics += 1;
        Some(Measurement {
            step: step.unwrap_or(self.lines_with_metrics).max(0),
            elapsed_secs: None,
            metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::job::DEFAULT_METRIC_REGEX;

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hypertune_lines_as_the_package_writes_them() {
        let text = concat!(
            r#"{"accuracy": "0.5", "checkpoint_path": "", "global_step": "1", "timestamp": 1.0, "trial": "3"}"#,
            "\n",
            r#"{"checkpoint_path": "", "global_step": "1", "loss": "2.5", "timestamp": 1.1, "trial": "3"}"#,
            "\n",
            r#"{"accuracy": "0.75", "checkpoint_path": "", "global_step": "2", "timestamp": 2.0, "trial": "3"}"#,
            "\n",
            r#"{"accuracy": "0.8", "global_step": "#,
            "\n",
        );
        let got = parse_hypertune(text, &ids(&["accuracy", "loss"]));
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].step, 1);
        assert_eq!(
            got[0].metrics,
            BTreeMap::from([("accuracy".into(), 0.5), ("loss".into(), 2.5)])
        );
        assert_eq!(got[1].metrics, BTreeMap::from([("accuracy".into(), 0.75)]));
    }

    #[test]
    fn hypertune_default_tag_is_the_first_metric_and_unknown_tags_are_ignored() {
        let text = r#"{"training/hptuning/metric": "0.3", "other": "9", "global_step": "0", "trial": "1"}"#;
        let got = parse_hypertune(text, &ids(&["auc"]));
        assert_eq!(
            got,
            vec![Measurement {
                step: 0,
                elapsed_secs: None,
                metrics: BTreeMap::from([("auc".into(), 0.3)])
            }]
        );
    }

    #[test]
    fn stdout_name_value_lines_with_and_without_steps() {
        let mut p =
            StdoutMetrics::new(DEFAULT_METRIC_REGEX, ids(&["accuracy", "loss"])).expect("regex");
        assert_eq!(
            p.parse_line("starting up, lr=0.1"),
            None,
            "not a study metric"
        );
        let a = p.parse_line("accuracy=0.5 loss=1.25e-1").expect("metrics");
        assert_eq!((a.step, a.metrics.len()), (1, 2));
        assert_eq!(a.metrics["loss"], 0.125);
        let b = p.parse_line("epoch=7 accuracy = 0.61").expect("metrics");
        assert_eq!(b.step, 7);
        assert_eq!(p.parse_line("accuracy=0.7").map(|m| m.step), Some(3));
        assert_eq!(p.parse_line("accuracy=nan"), None);
    }

    #[test]
    fn stdout_custom_regex() {
        let mut p = StdoutMetrics::new(r"^METRIC (?P<name>\w+): (?P<value>[-\d.]+)$", ids(&["f1"]))
            .expect("regex");
        assert_eq!(
            p.parse_line("METRIC f1: 0.9").map(|m| m.metrics["f1"]),
            Some(0.9)
        );
        assert_eq!(p.parse_line("f1=0.9"), None);
    }
}
