//! `augur study validate -f FILE` (and `study create --dry-run`): check a spec file on this
//! machine and show what it would do, starting nothing. The spec as the server would store
//! it (defaults filled in), and the command lines of the first trials, with the values the
//! study's algorithm would suggest first. The server may still refuse what its operator does
//! not allow (`--job-commands`, `--job-images`, …): that is decided where it runs.

use std::path::Path;

use augur_optimizer::{Assignment, Decision};

use super::error::{CliError, CliResult};
use crate::model::{StudySpec, TrialId, vertex};
use crate::service::design;

/// How many trials' command lines are shown at most.
const SHOWN_TRIALS: usize = 3;

/// The report for the spec in `file` (a study spec, or a Vertex AI job), or why it is wrong.
pub fn validate_file(file: &Path) -> CliResult<String> {
    let value = super::study::read_spec(file)?;
    let (spec, warnings) = if vertex::is_vertex_job(&value) {
        let imported = vertex::from_vertex(&value).map_err(|e| CliError::file(file, e))?;
        (imported.spec, imported.warnings)
    } else {
        let spec: StudySpec = serde_path_to_error::deserialize(value)
            .map_err(|e| CliError::file(file, format!("{}: {}", e.path(), e.inner())))?;
        (spec, Vec::new())
    };
    report(&spec, &warnings).map_err(|e| CliError::file(file, e))
}

/// What `spec` would do, or the first thing wrong with it.
fn report(spec: &StudySpec, warnings: &[String]) -> Result<String, String> {
    // Without a seed the server chooses one: the values shown are an example then.
    let chosen_seed = spec.seed.is_some();
    let config = spec
        .clone()
        .with_seed(0)
        .validate()
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    for warning in warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    out.push_str(&format!(
        "valid: {:?}, {} trials, {} at a time\n",
        spec.name, config.max_trials, config.parallel_trials
    ));
    let resolved = serde_json::to_value(spec).map_err(|e| e.to_string())?;
    let yaml = yaml_serde::to_string(&resolved).map_err(|e| e.to_string())?;
    out.push_str("the spec, as the server stores it:\n");
    for line in yaml.lines() {
        out.push_str(&format!("  {line}\n"));
    }
    let Some(job) = &config.trial_job else {
        out.push_str("no trial_job: workers ask for trials (ask/tell); nothing runs here\n");
        out.push_str("nothing was created\n");
        return Ok(out);
    };
    let shown = SHOWN_TRIALS.min(config.max_trials as usize);
    // A new study's first trials: the study's own policy, before any history.
    let first: Vec<Assignment> = design::policy_for(&config)
        .decide(&design::history_free(&config, 1), shown)
        .decisions
        .into_iter()
        .filter_map(|decision| match decision {
            Decision::New {
                mut parameters,
                budget,
            } => {
                if let Some(fidelity) = &config.fidelity {
                    fidelity.add_to(&mut parameters, budget);
                }
                Some(parameters)
            }
            _ => None,
        })
        .collect();
    out.push_str(&format!(
        "the first {} trials would run{} ({} executor{}):\n",
        first.len(),
        if chosen_seed {
            ""
        } else {
            " with values like these"
        },
        serde_json::to_value(job.executor.name())
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        job.workdir
            .as_deref()
            .map(|w| format!(", in {w}"))
            .unwrap_or_default(),
    ));
    for (i, parameters) in first.iter().enumerate() {
        let trial_id = TrialId::new(i as i64 + 1);
        for replica in job.replicas() {
            let argv = job.render_command(
                replica.command,
                replica.args,
                parameters,
                trial_id,
                "<trial dir>/params.json",
            );
            let image = replica
                .image
                .map(|image| format!("[{image}] "))
                .unwrap_or_default();
            out.push_str(&format!(
                "  trial {trial_id} {}: {image}{}\n",
                replica.id.name(),
                shell_words(&argv)
            ));
        }
    }
    out.push_str("nothing was created\n");
    Ok(out)
}

/// An argv as one line a shell would split the same way (for reading, not for running).
fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|word| {
            let plain = !word.is_empty()
                && word
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_=./:,+@%".contains(c));
            if plain {
                word.clone()
            } else {
                format!("'{}'", word.replace('\'', r"'\''"))
            }
        })
        .map(|w| super::study::printable(&w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The resolved spec `report` prints, for a test to read back.
#[cfg(test)]
fn resolved_spec(text: &str) -> serde_json::Value {
    let yaml: String = text
        .lines()
        .skip_while(|l| !l.starts_with("the spec, as the server stores it:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| format!("{}\n", &l[2..]))
        .collect();
    yaml_serde::from_str(&yaml).expect("yaml")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> StudySpec {
        serde_json::from_value(json).expect("spec")
    }

    #[test]
    fn a_valid_spec_shows_its_defaults_and_first_command_lines() {
        let s = spec(serde_json::json!({
            "name": "q", "algorithm": "quasi_random",
            "metrics": [{"id": "acc", "goal": "maximize"}],
            "parameters": [{"id": "lr", "type": "double", "min": 0.001, "max": 0.1, "scale": "log"},
                           {"id": "opt", "type": "categorical", "values": ["adam", "it's"]}],
            "max_trials": 5, "seed": 4,
            "trial_job": {"command": ["python3", "train.py"], "workdir": "examples/q"}
        }));
        let text = report(&s, &[]).expect("valid");
        assert!(
            text.starts_with("valid: \"q\", 5 trials, 1 at a time\n"),
            "{text}"
        );
        let resolved = resolved_spec(&text);
        assert_eq!(resolved["fail_fast_trials"], 3, "{text}");
        assert_eq!(resolved["trial_lease_secs"], 600, "{text}");
        let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("  trial ")).collect();
        assert_eq!(lines.len(), 3, "{text}");
        // The values the study's designer gives its first trials, as the arguments.
        use augur_optimizer::{DesignerInput, designer_for};
        let first = designer_for(augur_optimizer::Algorithm::QuasiRandom)
            .suggest(&DesignerInput {
                space: &s.validate().expect("config").space,
                metrics: &[],
                completed: &[],
                pending: &[],
                count: 1,
                first_trial_number: 1,
                seed: 4,
                previous_state: None,
                prior_studies: &[],
                desired_min_safe_trials_fraction: None,
            })
            .suggestions;
        let lr = crate::model::job::value_text(&first[0]["lr"]);
        assert!(
            lines[0].starts_with("  trial 1 workerpool0-0: python3 train.py --lr=")
                && lines[0].contains(&format!("--lr={lr}")),
            "{text}"
        );
        assert!(text.contains("in examples/q"), "{text}");
        assert!(text.ends_with("nothing was created\n"), "{text}");
    }

    #[test]
    fn a_wrong_spec_says_which_field() {
        let s = spec(serde_json::json!({
            "name": "q", "metrics": [{"id": "acc", "goal": "maximize"}],
            "parameters": [{"id": "lr", "type": "double", "min": 1, "max": 0}],
            "max_trials": 5
        }));
        let e = report(&s, &[]).expect_err("min > max");
        assert!(e.contains("parameters[0]"), "{e}");
    }

    #[test]
    fn words_a_shell_would_split_are_quoted() {
        let argv = ["python3", "train.py", "--name=it's a run", ""].map(String::from);
        assert_eq!(
            shell_words(&argv),
            r"python3 train.py '--name=it'\''s a run' ''"
        );
    }
}
