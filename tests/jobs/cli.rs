//! The `augur` binary as users run it: `study` subcommands against a live server, a
//! clear one-line error when there is none, and `augur run` stopped with Ctrl-C and resumed.

use crate::common::{self, routes};

use augur::model::{StudyId, TrialId};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn augur(url: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(common::augur_bin())
        .args(args)
        .env("AUGUR_URL", url)
        .env_remove("AUGUR_TOKEN")
        .output()
        .expect("run augur");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn study_commands_drive_a_live_server() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("study.yaml");
    std::fs::write(
        &file,
        "name: cli-study\nalgorithm: random\nmetrics:\n  - {id: loss, goal: minimize}\nparameters:\n  - {id: lr, type: double, min: 0.001, max: 0.1, scale: log}\n  - {id: opt, type: categorical, values: [sgd, 'adam,w']}\nmax_trials: 3\nparallel_trials: 3\n",
    )
    .expect("write spec");
    let url = app.base.clone();
    let run = move |args: Vec<String>| {
        let url = url.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                augur(&url, &args.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .await
            .expect("join")
        }
    };
    let (ok, out, err) = run(vec![
        "study".into(),
        "create".into(),
        "-f".into(),
        file.display().to_string(),
    ])
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("created study 1 (cli-study)"), "{out}");

    let s = app
        .post(&routes::suggest(1), serde_json::json!({"count": 2}))
        .await;
    assert_eq!(s.body["trials"].as_array().map(Vec::len), Some(2));
    app.post(
        &routes::trial_complete(1, 1),
        serde_json::json!({"metrics": {"loss": 0.25}}),
    )
    .await;

    let (ok, out, _) = run(vec!["study".into(), "list".into()]).await;
    assert!(
        ok && out.contains("cli-study") && out.contains("1/3"),
        "{out}"
    );
    let (ok, out, _) = run(vec!["study".into(), "show".into(), "1".into()]).await;
    assert!(ok && out.contains("\"best_trial\""), "{out}");
    app.post(
        &routes::trial_fail(1, 2),
        serde_json::json!({"reason": "out of memory"}),
    )
    .await;
    let (ok, out, _) = run(vec!["study".into(), "trials".into(), "1".into()]).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two trials: {out}");
    assert!(ok && lines[0].starts_with("    id  state"), "{out}");
    assert!(
        lines[1].starts_with("     1  completed") && lines[1].contains("0.25"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("     2  failed") && lines[2].contains("failed: out of memory"),
        "the failure's reason: {out}"
    );
    let (ok, out, _) = run(vec![
        "study".into(),
        "trials".into(),
        "1".into(),
        "--json".into(),
    ])
    .await;
    let trials: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(ok && trials.as_array().map(Vec::len) == Some(2), "{out}");
    let (ok, out, _) = run(vec!["study".into(), "best".into(), "1".into()]).await;
    assert!(
        ok && out.starts_with("best trial 1: {\"loss\":0.25} with "),
        "{out}"
    );
    let (ok, out, _) = run(vec![
        "study".into(),
        "best".into(),
        "1".into(),
        "--json".into(),
    ])
    .await;
    assert!(ok && out.contains("\"trials\""), "{out}");
    let (ok, out, _) = run(vec!["trial".into(), "show".into(), "1".into(), "2".into()]).await;
    assert!(
        ok && out.contains("\"fail_reason\": \"out of memory\""),
        "{out}"
    );
    let (ok, out, _) = run(vec![
        "study".into(),
        "export".into(),
        "1".into(),
        "--format".into(),
        "csv".into(),
    ])
    .await;
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "id,state,lr,opt,loss");
    assert_eq!(lines.len(), 3);
    assert!(
        lines[1].starts_with("1,completed,") && lines[1].ends_with(",0.25"),
        "{out}"
    );
    let (ok, out, _) = run(vec![
        "study".into(),
        "export".into(),
        "1".into(),
        "--format".into(),
        "json".into(),
    ])
    .await;
    let exported: serde_json::Value = serde_json::from_str(&out).expect("json export");
    assert!(ok && exported.as_array().map(Vec::len) == Some(2));
    let (ok, out, _) = run(vec!["study".into(), "stop".into(), "1".into()]).await;
    assert!(ok && out.contains("stopped"), "{out}");
    let (ok, _, err) = run(vec!["study".into(), "show".into(), "42".into()]).await;
    assert!(
        !ok && err.trim() == "augur: 404: study 42 not found",
        "{err}"
    );
    let (ok, out, _) = run(vec!["study".into(), "delete".into(), "1".into()]).await;
    assert!(ok && out.contains("deleted study 1"), "{out}");
    let (ok, _, err) = run(vec!["study".into(), "show".into(), "1".into()]).await;
    assert!(!ok && err.contains("404"), "{err}");
}

#[test]
fn an_unreachable_server_gives_one_clear_line() {
    let port = common::free_port();
    let (ok, _, err) = augur(&format!("http://127.0.0.1:{port}"), &["study", "list"]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the Augur server"), "{err}");
}

/// A trial for `augur run`: its process group holds a `sleep` child; it records both pids,
/// trains for a second, prints its loss and marks itself done.
const RUN_TRIAL_PY: &str = r#"
import os, subprocess, sys, time
out = os.environ["AIP_MODEL_DIR"]
child = subprocess.Popen(["sleep", "1000"])
open(os.path.join(out, "pids"), "w").write("%d %d" % (os.getpid(), child.pid))
time.sleep(1.0)
child.kill()
x = float(sys.argv[1].split("=", 1)[1])
print("loss=%f" % (x * x))
open(os.path.join(out, "done"), "w").write("1")
"#;

fn augur_run(file: &Path, database_url: &str) -> std::process::Child {
    Command::new(common::augur_bin())
        .args(["run", "-f", &file.display().to_string()])
        .args(["--database-url", database_url])
        .env("AUGUR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn augur run")
}

/// Wait for the child on a blocking thread, failing after `limit`.
async fn exit_within(child: std::process::Child, limit: Duration) -> Output {
    let pid = child.id();
    let waiting = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(limit, waiting).await {
        Ok(done) => done.expect("join").expect("wait"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("augur run did not exit within {limit:?}");
        }
    }
}

/// `(trial, job pid, child pid, done)` for every trial that has started a job.
fn started_trials(runs: &Path) -> Vec<(i64, i32, i32, bool)> {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return Vec::new();
    };
    let mut out: Vec<(i64, i32, i32, bool)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let trial = e.file_name().to_str()?.parse::<i64>().ok()?;
            let pids = std::fs::read_to_string(e.path().join("model/pids")).ok()?;
            let mut pids = pids.split_whitespace().filter_map(|p| p.parse().ok());
            let (job, child) = (pids.next()?, pids.next()?);
            Some((trial, job, child, e.path().join("model/done").exists()))
        })
        .collect();
    out.sort();
    out
}

/// Ctrl-C (SIGINT) stops `augur run` cleanly: it exits with status 130 (not success: the study
/// is unfinished) saying how to resume, no process of
/// any running job's group survives, and the interrupted trials stay active. Running the
/// same file again resumes the same study and the same trials (no duplicate study, nothing
/// failed) and ends with exactly `max_trials` completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_augur_run_cleanly_and_the_same_command_resumes_the_study() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("trial.py"), RUN_TRIAL_PY).expect("script");
    let file = dir.path().join("study.yaml");
    std::fs::write(
        &file,
        "name: ctrl-c\nalgorithm: random\nmetrics:\n  - {id: loss, goal: minimize}\n\
         parameters:\n  - {id: x, type: double, min: 0, max: 1}\n\
         max_trials: 6\nparallel_trials: 2\n\
         trial_job:\n  command: [python3, trial.py]\n  workdir: .\n  output_dir: runs\n",
    )
    .expect("spec");
    let runs = dir.path().join("runs");
    let db = format!("sqlite://{}", dir.path().join("augur.db").display());

    let first = augur_run(&file, &db);
    // Interrupt once a trial has finished and two jobs are running.
    let start = Instant::now();
    loop {
        let trials = started_trials(&common::study_dir(&runs, 1));
        let done = trials.iter().filter(|t| t.3).count();
        let running = trials
            .iter()
            .filter(|t| !t.3 && !common::alive_in_group(t.1).is_empty())
            .count();
        if done >= 1 && running == 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "jobs did not run: {trials:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    let out = exit_within(first, Duration::from_secs(20)).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("stopped; run the same command again to resume"),
        "{stdout}"
    );
    let after_first = started_trials(&common::study_dir(&runs, 1));
    let interrupted: Vec<i64> = after_first.iter().filter(|t| !t.3).map(|t| t.0).collect();
    // Two were running a moment before the signal (one may have finished since).
    assert!(!interrupted.is_empty(), "{after_first:?}");
    for (trial, job, child, _) in &after_first {
        assert!(
            common::alive_in_group(*job).is_empty() && common::alive_in_group(*child).is_empty(),
            "trial {trial}: a process of its job survived Ctrl-C"
        );
    }
    {
        let store = augur::store::connect(&db).await.expect("open the database");
        let studies = store
            .list_studies(None, None, StudyId::new(0), 10)
            .await
            .expect("list");
        assert_eq!(studies.len(), 1);
        assert_eq!(studies[0].state, augur::model::StudyState::Active);
        for &trial in &interrupted {
            let t = store
                .get_trial(studies[0].id, TrialId::new(trial))
                .await
                .expect("get");
            assert_eq!(
                t.map(|t| t.state),
                Some(augur::model::TrialState::Active),
                "trial {trial} is left to resume"
            );
        }
    }

    let second = augur_run(&file, &db);
    let out = exit_within(second, Duration::from_secs(90)).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("resuming study 1 from an earlier run"),
        "{stderr}"
    );
    assert!(
        stdout.contains("study 1 completed: 6 completed, 0 infeasible, 0 failed of 6 trials"),
        "{stdout}"
    );
    let store = augur::store::connect(&db).await.expect("open the database");
    let studies = store
        .list_studies(None, None, StudyId::new(0), 10)
        .await
        .expect("list");
    assert_eq!(studies.len(), 1, "no duplicate study");
    let counts = &studies[0].trial_counts;
    assert_eq!((counts.total, counts.completed), (6, 6), "{counts:?}");
    let stored = store.all_trials(studies[0].id).await.expect("trials");
    assert_eq!(stored.len(), 6, "the study's counts agree with its trials");
    // The interrupted trials were resumed, not replaced: launched again, same directories.
    for trial in interrupted {
        let log =
            std::fs::read_to_string(common::study_dir(&runs, 1).join(format!("{trial}/job.log")))
                .expect("log");
        assert_eq!(
            log.matches(&format!("=== augur: trial {trial} attempt 1:"))
                .count(),
            2,
            "{log}"
        );
        assert!(
            common::study_dir(&runs, 1)
                .join(format!("{trial}/model/done"))
                .exists()
        );
    }
}

/// `trial:` names belong to the tokens the dispatcher issues per launch, which replace one
/// of the same name: an admin token so named would be overwritten by the next launch of
/// that trial. `token create` refuses them, and stores nothing.
#[test]
fn token_create_refuses_the_names_of_trial_tokens() {
    let db = common::sqlite_db();
    let create = |name: &str| {
        augur(
            "http://127.0.0.1:1",
            &[
                "token",
                "create",
                "--name",
                name,
                "--role",
                "admin",
                "--database-url",
                &db.url,
            ],
        )
    };
    let (ok, stdout, stderr) = create("trial:1:1");
    assert!(!ok, "created: {stdout}");
    assert!(
        stderr.contains("--name") && stderr.contains("trial:"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = create("ci");
    assert!(ok, "{stderr}");
    assert!(
        stdout.trim().starts_with("augur_"),
        "one token printed: {stdout}"
    );
    let count = tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(async {
            let store = augur::store::connect(&db.url).await.expect("store");
            store.count_tokens().await.expect("count")
        });
    assert_eq!(count, 1, "only the admin token named ci");
}

/// The fixture with every field of a Vertex job that Augur reads, and the pointers of those
/// it does not keep (warned about, or output-only).
fn every_field_fixture() -> (String, serde_json::Value, Vec<String>) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vertex");
    let file = format!("{dir}/every_field.json");
    let doc = serde_json::from_str(&std::fs::read_to_string(&file).expect("fixture"))
        .expect("fixture JSON");
    let ignored: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{dir}/every_field.ignored.json")).expect("ignored"),
    )
    .expect("ignored JSON");
    let pointers = ["warned", "output_only"]
        .iter()
        .flat_map(|k| ignored[k].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    (file, doc, pointers)
}

/// `doc` less the fields at `pointers`.
fn without(mut doc: serde_json::Value, pointers: &[String]) -> serde_json::Value {
    for pointer in pointers {
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        let removed = doc
            .pointer_mut(parent)
            .and_then(serde_json::Value::as_object_mut)
            .and_then(|o| o.remove(key));
        assert!(removed.is_some(), "{pointer} is in the document");
    }
    doc
}

/// `augur study create -f` takes a Vertex AI job file unchanged, and `augur study export ID
/// --format vertex` writes it back as it was: the example file, and a job with every field
/// Augur reads (less those the create warned it ignores); created again from the export,
/// the study has the same spec, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vertex_job_file_round_trips_through_create_and_export() {
    // No dispatch: the jobs' images are not on this machine.
    let app = common::spawn_app_configured(common::sqlite_db(), |c| c.dispatch = false).await;
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/vertex/hp_tuning_job.yaml"
    );
    let example_doc: serde_json::Value =
        yaml_serde::from_str(&std::fs::read_to_string(example).expect("example")).expect("yaml");
    let (fixture, fixture_doc, ignored) = every_field_fixture();
    let dir = tempfile::tempdir().expect("dir");
    let mut next_id = 1;
    let cases = [
        (example.to_string(), without(example_doc, &[])),
        (fixture, without(fixture_doc, &ignored)),
    ];
    for (file, expected) in cases {
        let (ok, out, err) = augur_async(&app.base, &["study", "create", "-f", &file]).await;
        let first = next_id;
        assert!(
            ok && out.contains(&format!("created study {first}")),
            "{out}\n{err}"
        );
        let (ok, exported, err) = augur_async(
            &app.base,
            &["study", "export", &first.to_string(), "--format", "vertex"],
        )
        .await;
        assert!(ok, "{err}");
        let doc: serde_json::Value = serde_json::from_str(&exported).expect("exported JSON");
        assert_eq!(doc, expected, "{file} comes back as it was");
        let again = dir.path().join(format!("exported-{first}.json"));
        std::fs::write(&again, &exported).expect("write");
        let (ok, out, err) = augur_async(
            &app.base,
            &["study", "create", "-f", &again.display().to_string()],
        )
        .await;
        let second = first + 1;
        assert!(
            ok && out.contains(&format!("created study {second}")),
            "{out}\n{err}"
        );
        next_id += 2;
        let spec = |id: i64| {
            let app = &app;
            async move {
                let mut s = app.get(&routes::study(id)).await.body["spec"].clone();
                // Each study has a seed of its own unless the spec gives one.
                s["seed"] = serde_json::Value::Null;
                s
            }
        };
        assert_eq!(spec(second).await, spec(first).await, "{file}");
    }
}

/// `augur study create --dry-run` of a Vertex job names what it ignores and shows the spec
/// with the machine types and `args` kept, and each pool's command line: the command, the
/// args, then the values.
#[tokio::test]
async fn a_dry_run_of_a_vertex_job_shows_its_args_and_machine_types() {
    let (fixture, _, _) = every_field_fixture();
    let out = Command::new(common::augur_bin())
        .args(["study", "create", "--dry-run", "-f", &fixture])
        .args(["--url", "http://127.0.0.1:9"])
        .env_remove("AUGUR_TOKEN")
        .output()
        .expect("augur");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for part in [
        "warning: trialJobSpec.workerPoolSpecs[0].diskSpec: ignored",
        "machine_type: n1-standard-8",
        "accelerator_type: NVIDIA_TESLA_T4",
        "machine_type: a2-highgpu-1g",
        "trial 1 workerpool0-0: [us-docker.pkg.dev/p/trainer:2] python3 -m trainer.task --epochs=20 --data=/data/imagenet --",
        "trial 1 workerpool1-2: [us-docker.pkg.dev/p/trainer:2] python3 -m trainer.task --epochs=20 --data=/data/imagenet --",
        "trial 1 workerpool3-0: [us-docker.pkg.dev/p/evaluator:2] --mode=eval --data=/data/imagenet --",
    ] {
        assert!(stdout.contains(part), "{part:?} in:\n{stdout}");
    }
    assert!(stdout.ends_with("nothing was created\n"), "{stdout}");
}

/// Runs `augur` with `args` against `url` on a blocking thread.
async fn augur_async(url: &str, args: &[&str]) -> (bool, String, String) {
    let url = url.to_string();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        augur(&url, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .expect("join")
}

/// Issue 10, finding 10: a name with an escape sequence (retitling the terminal, or worse),
/// a NUL or a line break (a forged row) is printed escaped. Names are refused at validation
/// now, so the study is stored as an older version would have stored it: through the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn study_list_prints_control_characters_escaped() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let store = augur::store::connect(&app.db.url).await.expect("store");
    let name = "evil\u{1b}]0;pwned\u{7}\n     2  completed  random  3/3  forged\u{0}\u{9b}";
    let spec: augur::model::StudySpec = serde_json::from_value(serde_json::json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [{"id": "x", "type": "double", "min": 0, "max": 1}],
        "max_trials": 3,
        "seed": 1
    }))
    .expect("spec");
    store
        .insert_study(&spec, None, chrono::Utc::now())
        .await
        .expect("stored as an older version would have");
    let (ok, out, err) = augur_async(&app.base, &["study", "list"]).await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 2, "a forged row: {out:?}");
    let raw = out
        .chars()
        .find(|c| c.is_control() && *c != '\n')
        .map(|c| c.escape_unicode().to_string());
    assert_eq!(raw, None, "a control character printed raw: {out:?}");
    assert!(
        out.contains(r"evil\u{1b}]0;pwned\u{7}\n     2  completed"),
        "{out}"
    );
}

/// Issue 10, finding 8: a CSV cell that starts with `=`, `+`, `-`, `@` (or a tab or CR) is a
/// formula to a spreadsheet (`=HYPERLINK(…)` exfiltrates, DDE runs commands). String cells
/// get a leading `'`, as OWASP and the spreadsheets expect; numbers, negative metric values
/// included, stay numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_export_neutralises_formulas_and_keeps_numbers() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let values = [
        "=HYPERLINK(\"http://evil.example\",\"x\")",
        "+1+1",
        "-2+3",
        "@SUM(A1)",
        "plain",
    ];
    let study = app
        .create_study(serde_json::json!({
            "name": "csv",
            "algorithm": "random",
            "metrics": [{"id": "loss", "goal": "minimize"}],
            "parameters": [
                {"id": "opt", "type": "categorical", "values": values},
                {"id": "x", "type": "double", "min": -5, "max": 5}
            ],
            "max_trials": 10,
            "seed": 1
        }))
        .await;
    for (i, value) in values.iter().enumerate() {
        let r = app
            .post(
                &routes::trials(study),
                serde_json::json!({
                    "parameters": {"opt": value, "x": -1.5},
                    "final_measurement": {"metrics": {"loss": -0.25 - i as f64}}
                }),
            )
            .await;
        assert_eq!(r.status, reqwest::StatusCode::CREATED, "{}", r.body);
    }
    let (ok, out, err) = augur_async(
        &app.base,
        &["study", "export", &study.to_string(), "--format", "csv"],
    )
    .await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "id,state,opt,x,loss");
    assert_eq!(
        lines[1],
        r#"1,completed,"'=HYPERLINK(""http://evil.example"",""x"")",-1.5,-0.25"#
    );
    // Neutralised cells are quoted too, as the dashboard's export quotes them (`cli/csv.rs`).
    assert_eq!(lines[2], r#"2,completed,"'+1+1",-1.5,-1.25"#);
    assert_eq!(lines[3], r#"3,completed,"'-2+3",-1.5,-2.25"#);
    assert_eq!(lines[4], r#"4,completed,"'@SUM(A1)",-1.5,-3.25"#);
    assert_eq!(lines[5], "5,completed,plain,-1.5,-4.25");
}

/// `augur token create --role R --expires-in 30d | list | revoke` on the database, and
/// `augur audit` through the API: the trail names who did what.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_with_roles_from_the_command_line_and_the_audit_trail() {
    let db = common::sqlite_db();
    let url = db.url.clone();
    let token = |args: Vec<String>| {
        let url = url.clone();
        async move {
            let mut args = args;
            args.extend(["--database-url".to_string(), url]);
            augur_async(
                "http://127.0.0.1:1",
                &args.iter().map(String::as_str).collect::<Vec<_>>(),
            )
            .await
        }
    };
    let (ok, alice, err) = token(
        [
            "token",
            "create",
            "--name",
            "alice",
            "--role",
            "writer",
            "--expires-in",
            "30d",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(ok, "{err}");
    let alice = alice.trim().to_string();
    assert!(err.contains("writer") && err.contains("expires"), "{err}");
    let (ok, _, err) = token(
        ["token", "create", "--name", "bob", "--role", "root"]
            .map(String::from)
            .to_vec(),
    )
    .await;
    assert!(!ok && err.contains("root"), "{err}");
    let (ok, _, err) = token(
        [
            "token",
            "create",
            "--name",
            "bob",
            "--role",
            "reader",
            "--expires-in",
            "3y",
        ]
        .map(String::from)
        .to_vec(),
    )
    .await;
    assert!(!ok && err.contains("unit"), "{err}");

    let app = common::spawn_app_with(db, Some("cli-admin")).await;
    let as_alice = common::call(
        &app.http,
        &app.base,
        Some(&alice),
        reqwest::Method::POST,
        "/v1/studies",
        Some(common::spec("random", 3, 1)),
    )
    .await;
    assert_eq!(
        as_alice.status,
        reqwest::StatusCode::CREATED,
        "{}",
        as_alice.body
    );

    let (ok, listed, err) = token(["token", "list"].map(String::from).to_vec()).await;
    assert!(ok, "{err}");
    let rows: Vec<&str> = listed.lines().collect();
    assert!(rows[0].starts_with("name"), "{listed}");
    let alice_row = rows
        .iter()
        .find(|r| r.starts_with("alice"))
        .expect("alice listed");
    assert!(
        alice_row.contains("writer") && !alice_row.contains(&alice),
        "{listed}"
    );
    assert!(rows.iter().any(|r| r.starts_with("env ")), "{listed}");

    let (ok, _, err) = token(["token", "revoke", "alice"].map(String::from).to_vec()).await;
    assert!(ok, "{err}");
    let (_, listed, _) = token(["token", "list"].map(String::from).to_vec()).await;
    assert!(!listed.contains("alice"), "{listed}");
    // Revoked on the database: the running server refuses it within its cache's bound.
    common::eventually("alice refused", augur::service::TOKEN_CACHE_TTL * 2, || {
        let (app, alice) = (&app, &alice);
        async move {
            let r = common::call(
                &app.http,
                &app.base,
                Some(alice),
                reqwest::Method::GET,
                "/v1/studies",
                None,
            )
            .await;
            if r.status == reqwest::StatusCode::UNAUTHORIZED {
                Ok(())
            } else {
                Err(r.status.to_string())
            }
        }
    })
    .await;

    let audit = tokio::task::spawn_blocking({
        let base = app.base.clone();
        move || {
            std::process::Command::new(common::augur_bin())
                .args(["audit", "--url", &base])
                .env("AUGUR_TOKEN", "cli-admin")
                .output()
                .expect("augur audit")
        }
    })
    .await
    .expect("join");
    assert!(
        audit.status.success(),
        "{}",
        String::from_utf8_lossy(&audit.stderr)
    );
    let trail = String::from_utf8_lossy(&audit.stdout).into_owned();
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let lines: Vec<&str> = trail.lines().collect();
    assert_eq!(lines.len(), 3, "{trail}");
    assert!(
        lines[0].contains(&format!("cli:{user}  token.create"))
            && lines[0].contains("alice (writer, expires"),
        "{trail}"
    );
    assert!(lines[1].contains("alice  study.create  study 1"), "{trail}");
    assert!(
        lines[2].contains(&format!("cli:{user}  token.revoke  alice")),
        "{trail}"
    );
}

/// A trial command that does not exist is no success: `augur run` prints each trial's failure
/// as it happens, the study fails once its first three trials failed alike
/// (`fail_fast_trials`), and the command exits non-zero with the reason. With the rule off,
/// a study that ends with no trial completed exits non-zero too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn augur_run_of_a_command_that_does_not_exist_fails_saying_why() {
    let dir = tempfile::tempdir().expect("dir");
    let write = |name: &str, extra: &str| {
        let file = dir.path().join(name);
        std::fs::write(
            &file,
            format!(
                "name: typo\nalgorithm: random\nmetrics: [{{id: loss, goal: minimize}}]\n\
                 parameters: [{{id: x, type: double, min: 0, max: 1}}]\n\
                 max_trials: 6\nparallel_trials: 1\n{extra}\
                 trial_job:\n  command: [pythno3, train.py]\n  output_dir: runs\n"
            ),
        )
        .expect("spec");
        file
    };
    let db = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let out = exit_within(
        augur_run(&write("typo.yaml", ""), &db("a.db")),
        Duration::from_secs(60),
    )
    .await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout}\n{stderr}");
    for trial in 1..=3 {
        assert!(
            stderr.contains(&format!(
                "trial {trial} failed: could not start the job: pythno3"
            )),
            "trial {trial}'s reason as it happened: {stderr}"
        );
    }
    assert!(
        stderr.contains("the first 3 trials all failed"),
        "the study's reason: {stderr}"
    );
    assert!(
        stdout.contains("study 1 failed: 0 completed, 0 infeasible, 3 failed of 6 trials"),
        "{stdout}"
    );

    let out = exit_within(
        augur_run(&write("off.yaml", "fail_fast_trials: 0\n"), &db("b.db")),
        Duration::from_secs(60),
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("no trial completed (6 failed, 0 infeasible)"),
        "{stderr}"
    );
}

/// `augur study validate -f` and `study create --dry-run` check a file and show what it
/// would run without a server (the `--url` here reaches nothing), creating nothing.
#[tokio::test]
async fn study_validate_shows_the_first_command_lines_and_starts_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let quickstart = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/quickstart/study.yaml"
    );
    for args in [
        vec!["study", "validate", "-f", quickstart],
        vec!["study", "create", "--dry-run", "-f", quickstart],
    ] {
        let out = Command::new(common::augur_bin())
            .args(&args)
            .args(["--url", "http://127.0.0.1:9"])
            .current_dir(dir.path())
            .env_remove("AUGUR_TOKEN")
            .output()
            .expect("augur");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("trial 1 workerpool0-0: python3 train.py --"),
            "{stdout}"
        );
        assert!(
            stdout.contains("fail_fast_trials: 3"),
            "defaults shown: {stdout}"
        );
        assert!(stdout.ends_with("nothing was created\n"), "{stdout}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("dir").count(),
        0,
        "no database, no trial directory"
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: x\nmetrics: [{id: a, goal: maximize}]\nparameters: [{id: p, type: double, min: 1, max: 0}]\nmax_trials: 1\n",
    )
    .expect("bad");
    let out = Command::new(common::augur_bin())
        .args(["study", "validate", "-f"])
        .arg(&bad)
        .output()
        .expect("augur");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("parameters[0]"), "{stderr}");
}

/// The README's multi-fidelity example as users run it: `augur study validate` shows the
/// first trials at the lowest rung (`--epochs=1`), and `augur run` (on a copy whose trainer
/// path is absolute, so its runs land in a temporary directory) finishes the study on the
/// embedded database, every trial completed, some of them promoted to 9 epochs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_multi_fidelity_example_validates_and_runs_to_the_end() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = root.join("examples/multi-fidelity/study.yaml");
    let out = Command::new(common::augur_bin())
        .args(["study", "validate", "-f"])
        .arg(&example)
        .output()
        .expect("augur");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("trial 1 workerpool0-0: python3 ../quickstart/train.py --epochs=1 "),
        "{stdout}"
    );
    let dir = tempfile::tempdir().expect("dir");
    let trainer = root.join("examples/quickstart/train.py");
    let text = std::fs::read_to_string(&example)
        .expect("example")
        .replace("../quickstart/train.py", &trainer.display().to_string());
    let study = dir.path().join("study.yaml");
    std::fs::write(&study, text).expect("copy");
    let db = format!("sqlite://{}", dir.path().join("augur.db").display());
    let run = exit_within(augur_run(&study, &db), Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("27 completed, 0 infeasible, 0 failed of 27 trials"),
        "{stdout}"
    );
    // The best trial trained 9 epochs: its log shows the launches at each rung.
    let runs: Vec<_> = walk_logs(&dir.path().join("runs"));
    let nine = runs.iter().filter(|t| t.contains("--epochs=9")).count();
    let resumed = runs
        .iter()
        .filter(|t| t.contains("resumed from checkpoint at epoch 3"))
        .count();
    assert!(nine >= 1, "some trial ran to 9 epochs");
    assert_eq!(nine, resumed, "every 9-epoch attempt resumed at epoch 3");
}

/// The text of every trial's log under `runs`.
fn walk_logs(runs: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![runs.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                out.push(std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    out
}

/// `augur study create -f` with a bad `study_stopping` (Augur's spec) or
/// `studyStoppingConfig` (a Vertex job) fails naming the field, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn study_create_names_a_bad_study_stopping_field() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let dir = tempfile::tempdir().expect("dir");
    let cases = [
        (
            "augur.yaml",
            "name: x\nmetrics: [{id: a, goal: maximize}]\nparameters: [{id: p, type: double, min: 0, max: 1}]\nmax_trials: 5\nstudy_stopping: {max_num_trials_no_progress: 2, min_delta_change: -1}\n",
            "study_stopping.min_delta_change",
        ),
        (
            "vertex.yaml",
            "displayName: x\nmaxTrialCount: 5\nstudySpec:\n  metrics: [{metricId: a, goal: MAXIMIZE}]\n  parameters: [{parameterId: p, doubleValueSpec: {minValue: 0, maxValue: 1}}]\n  studyStoppingConfig: {minNumTrials: 9, maxNumTrials: 3}\n",
            "studySpec.studyStoppingConfig.minNumTrials",
        ),
    ];
    for (name, text, field) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
        let (ok, out, err) = augur_async(
            &app.base,
            &["study", "create", "-f", &file.display().to_string()],
        )
        .await;
        assert!(!ok, "{name}: {out}");
        assert!(err.contains(field), "{name}: {field} not in {err}");
    }
    let listed = app.get("/v1/studies").await.body;
    assert_eq!(listed["studies"], serde_json::json!([]), "{listed}");
}
