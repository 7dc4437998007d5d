//! Text that callers control, on its way out (issue 26, finding 13): a CSV export that a
//! spreadsheet would split or run, reasons large enough to bloat every page of trials, and
//! an audit trail whose names reorder or hide what a terminal shows.

use crate::common::{self, routes};

use reqwest::StatusCode;
use serde_json::json;

on_both_backends!(fail_and_infeasible_reasons_are_capped);

/// `augur <args> --url <app>`'s stdout; panics unless it succeeds.
async fn cli(app: &common::TestApp, args: &[&str]) -> String {
    let mut command = std::process::Command::new(common::augur_bin());
    command
        .args(args)
        .args(["--url", &app.base])
        .env_remove("AUGUR_TOKEN")
        .env_remove("AUGUR_URL");
    let out = tokio::task::spawn_blocking(move || command.output().expect("run augur"))
        .await
        .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// A cell that starts with `;` splits in a spreadsheet whose list separator is `;` (many
/// locales), and what follows it (`=1+1`) becomes a formula of its own: quoted, as the
/// dashboard's export quotes it (one rule, `csv.js` and `cli/csv.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_export_quotes_what_a_spreadsheet_would_split_or_run() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let spec = json!({
        "name": "csv",
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [{"id": "opt", "type": "categorical",
                        "values": [";=1+1", "a;b", "@SUM(A1)", "-1", "adam"]}],
        "max_trials": 10
    });
    let study = app.create_study(spec).await;
    for opt in [";=1+1", "a;b", "@SUM(A1)", "-1"] {
        let r = app
            .post(
                &routes::trials(study),
                json!({"parameters": {"opt": opt},
                       "final_measurement": {"metrics": {"accuracy": -0.5}}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let csv = cli(
        &app,
        &["study", "export", &study.to_string(), "--format", "csv"],
    )
    .await;
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(
        rows,
        vec![
            "id,state,opt,accuracy",
            "1,completed,\";=1+1\",-0.5",
            "2,completed,\"a;b\",-0.5",
            "3,completed,\"'@SUM(A1)\",-0.5",
            "4,completed,-1,-0.5",
        ],
        "{csv}"
    );
}

/// A 900 KB reason on each trial made a page of 1,000 trials ~0.9 GB: a reason is at most
/// 4 KiB, and a longer one is refused with 400 naming its field (nothing is stored).
async fn fail_and_infeasible_reasons_are_capped(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let study = app.create_study(common::spec("random", 10, 5)).await;
    app.post(
        &routes::suggest(study),
        json!({"count": 3, "client_id": "w"}),
    )
    .await;
    let long = "x".repeat(4097);
    let refused = [
        ("1/fail", json!({"reason": long}), "reason"),
        (
            "2/complete",
            json!({"infeasible_reason": long}),
            "infeasible_reason",
        ),
    ];
    for (path, body, field) in refused {
        let r = app.post(&routes::trial(study, path), body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}: {}", r.body);
        assert_eq!(r.body["error"]["field"], field, "{}", r.body);
        assert!(
            r.body["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("4096"),
            "{}",
            r.body
        );
    }
    let t = app.get(&routes::trial(study, 1)).await.body;
    assert_eq!(t["state"], "active", "{t}");
    // 4 KiB exactly (in characters of several bytes: the cap counts bytes) is kept whole.
    let most = "é".repeat(2048);
    let r = app
        .post(&routes::trial_fail(study, 3), json!({"reason": most}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["fail_reason"], most.as_str());
}

/// Bidirectional overrides (U+202E) and zero-width characters in a study's name reach the
/// audit trail's detail; `augur audit` prints them escaped, so a terminal shows what is
/// stored, not a reordered or hidden line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn augur_audit_prints_bidi_and_zero_width_characters_escaped() {
    let app = common::spawn_app(common::sqlite_db()).await;
    let mut spec = common::spec("random", 2, 1);
    spec["name"] = json!("report\u{202e}fdp.exe\u{200b}\u{2066}x\u{feff}");
    app.create_study(spec).await;
    let out = cli(&app, &["audit"]).await;
    for c in ['\u{202e}', '\u{200b}', '\u{2066}', '\u{feff}'] {
        assert!(!out.contains(c), "{c:?} printed raw: {out:?}");
    }
    assert!(
        out.contains(r"report\u{202e}fdp.exe\u{200b}\u{2066}x\u{feff}"),
        "{out:?}"
    );
}
