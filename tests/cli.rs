//! The `augur` binary as users run it: `study` subcommands against a live server, and a
//! clear one-line error when there is none.

mod common;

use std::process::Command;

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
        .post("/v1/studies/1/suggest", serde_json::json!({"count": 2}))
        .await;
    assert_eq!(s.body["trials"].as_array().map(Vec::len), Some(2));
    app.post(
        "/v1/studies/1/trials/1/complete",
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
    let (ok, out, _) = run(vec!["study".into(), "trials".into(), "1".into()]).await;
    assert_eq!(out.lines().count(), 2, "{out}");
    assert!(
        ok && out.contains("completed") && out.contains("0.25"),
        "{out}"
    );
    let (ok, out, _) = run(vec!["study".into(), "best".into(), "1".into()]).await;
    assert!(ok && out.contains("0.25"), "{out}");
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
}

#[test]
fn an_unreachable_server_gives_one_clear_line() {
    let port = common::free_port();
    let (ok, _, err) = augur(&format!("http://127.0.0.1:{port}"), &["study", "list"]);
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot reach the Augur server"), "{err}");
}
