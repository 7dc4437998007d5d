//! The dashboard over HTTP against a real server and database: pages and assets are served,
//! the chart endpoints aggregate the right numbers, the table's cursor sees later changes,
//! and a protected server lets a browser in through the login cookie for reads only.
//! The browser itself is driven by `scripts/browser-test.sh`; its seed data comes from the
//! ignored `seed_browser_fixture` below.

use crate::common::{self, routes};

use std::time::Duration;

use augur::model::{Measurement, StudyId, TrialId, TrialState};
use augur::store::TrialRecord;
use augur_optimizer::Value;
use chrono::Utc;
use common::{TestApp, spawn_app, spawn_app_with, sqlite_db};
use reqwest::StatusCode;
use serde_json::{Value as Json, json};

fn spec(name: &str, max_trials: i64) -> Json {
    json!({
        "name": name,
        "algorithm": "random",
        "metrics": [{"id": "accuracy", "goal": "maximize"}],
        "parameters": [
            {"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"},
            {"id": "layers", "type": "integer", "min": 1, "max": 8},
            {"id": "kernel", "type": "categorical", "values": ["rbf", "poly"]}
        ],
        "max_trials": max_trials,
        "parallel_trials": 5,
        "seed": 3
    })
}

/// The objective depends on `lr` only (peak at 0.01): importance must say so.
fn accuracy(lr: f64) -> f64 {
    1.0 - (lr.log10() + 2.0).powi(2) / 16.0
}

/// Adds `n` completed trials on a fixed design; returns their accuracies in id order.
async fn add_trials(app: &TestApp, study: i64, n: usize) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..n {
        let lr = 10f64.powf(-4.0 + 4.0 * ((i * 37) % n) as f64 / n as f64);
        let acc = accuracy(lr);
        let r = app
            .post(
                &routes::trials(study),
                json!({
                    "parameters": {"lr": lr, "layers": 1 + (i % 8) as i64, "kernel": if i % 3 == 0 { "poly" } else { "rbf" }},
                    "final_measurement": {"metrics": {"accuracy": acc}}
                }),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        out.push(acc);
    }
    out
}

#[tokio::test]
async fn pages_are_html_and_plotly_is_served_from_the_binary() {
    let app = spawn_app(sqlite_db()).await;
    let study = app.create_study(spec("pages", 10)).await;
    for (path, page) in [
        ("/".to_string(), "studies"),
        (routes::study_page(study), "study"),
        (routes::trial_page(study, 1), "trial"),
        ("/compare?studies=1,2".to_string(), "compare"),
    ] {
        let r = app
            .http
            .get(format!("{}{path}", app.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::OK, "{path}");
        let ct = r.headers()["content-type"]
            .to_str()
            .expect("ct")
            .to_string();
        assert!(ct.starts_with("text/html"), "{path}: {ct}");
        let body = r.text().await.expect("body");
        assert!(
            body.contains(&format!("data-page=\"{page}\"")),
            "{path}: {body}"
        );
    }
    let r = app.get("/studies/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    let r = app
        .http
        .get(format!("{}/dashboard/plotly.min.js", app.base))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["cache-control"]
            .to_str()
            .expect("cc")
            .contains("immutable")
    );
    let js = r.text().await.expect("body");
    assert!(
        js.contains("plotly.js v3") && js.len() > 1_000_000,
        "{}",
        js.len()
    );
    for asset in [
        "/dashboard/style.css",
        "/dashboard/js/main.js",
        "/dashboard/js/study.js",
    ] {
        let r = app
            .http
            .get(format!("{}{asset}", app.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::OK, "{asset}");
        assert_eq!(r.headers()["cache-control"], "no-cache", "{asset}");
    }
}

/// The trial page's terminal draws with xterm.js, served from the binary as its package
/// ships it (`assets/vendor/xterm/`), kept for good (pages ask with `?v=`); no other file of
/// that directory, nor any name outside it.
#[tokio::test]
async fn xterm_is_served_from_the_binary_by_name_only() {
    let app = spawn_app(sqlite_db()).await;
    for (file, content_type, needle) in [
        ("xterm.js", "text/javascript; charset=utf-8", "Terminal"),
        ("addon-fit.js", "text/javascript; charset=utf-8", "FitAddon"),
        ("xterm.css", "text/css; charset=utf-8", ".xterm"),
    ] {
        let r = app
            .http
            .get(format!("{}/dashboard/vendor/{file}", app.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::OK, "{file}");
        assert_eq!(r.headers()["content-type"], content_type, "{file}");
        assert!(
            r.headers()["cache-control"]
                .to_str()
                .expect("cc")
                .contains("immutable"),
            "{file}"
        );
        assert!(r.text().await.expect("body").contains(needle), "{file}");
    }
    for unknown in ["LICENSE", "README.md", "xterm.mjs", "..%2Fjs%2Fmain.js"] {
        let r = app.get(&format!("/dashboard/vendor/{unknown}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{unknown}");
    }
}

#[tokio::test]
async fn pages_load_the_entry_module_and_modules_are_served_by_name_only() {
    let app = spawn_app(sqlite_db()).await;
    let page = app
        .http
        .get(format!("{}/", app.base))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    assert!(
        page.contains(r#"<script type="module" src="/dashboard/js/main.js?v="#)
            && page.contains(r#"<link rel="modulepreload" href="/dashboard/js/study.js">"#),
        "{page}"
    );

    let r = app
        .http
        .get(format!("{}/dashboard/js/main.js", app.base))
        .send()
        .await
        .expect("get");
    assert_eq!(
        r.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    let main = r.text().await.expect("body");
    assert!(
        main.contains("import { studyPage } from './study.js';"),
        "{main}"
    );

    // Only the embedded modules: no other name, and no way out of the directory.
    for unknown in [
        "nope.js",
        "app.js",
        "..%2Fmod.rs",
        "..%2F..%2F..%2FCargo.toml",
    ] {
        let r = app.get(&format!("/dashboard/js/{unknown}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{unknown}");
        assert_eq!(r.body["error"]["code"], json!("not_found"), "{unknown}");
    }
    let r = app.get("/dashboard/app.js").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "the single script is gone");
}

#[tokio::test]
async fn table_lists_every_trial_as_columns_and_its_cursor_sees_later_changes() {
    let app = spawn_app(sqlite_db()).await;
    let study = app.create_study(spec("table", 100)).await;
    let acc = add_trials(&app, study, 30).await;
    let t = app.get(&routes::table(study)).await;
    assert_eq!(t.status, StatusCode::OK, "{}", t.body);
    assert_eq!(t.body["ids"].as_array().map(Vec::len), Some(30));
    assert_eq!(t.body["values"]["accuracy"][4], json!(acc[4]));
    assert_eq!(t.body["params"]["kernel"][0], json!("poly"));
    assert_eq!(t.body["states"][0], json!("completed"));
    let names: Vec<&str> = t.body["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    assert_eq!(names, ["lr", "layers", "kernel"]);

    // A trial suggested and completed after the snapshot comes back from `changes`.
    let cursor = t.body["cursor"].as_str().expect("cursor").to_string();
    let s = app.post(&routes::suggest(study), json!({"count": 1})).await;
    let id = s.body["trials"][0]["id"].as_i64().expect("trial id");
    let c = app.get(&routes::changes_after(study, cursor)).await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.body);
    let ids: Vec<i64> = c.body["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .filter_map(|t| t["id"].as_i64())
        .collect();
    assert_eq!(ids, [id]);
}

/// Parallel coordinates draw every trial of a conditional space: 22 `adam` trials lack
/// `momentum` (a child of `optimizer: sgd`) and sit on its "inactive" tick, not off the chart.
#[tokio::test]
async fn parallel_coordinates_place_inactive_values_on_a_tick_of_their_own() {
    let app = spawn_app(sqlite_db()).await;
    let study = app
        .create_study(json!({
            "name": "conditional",
            "algorithm": "random",
            "metrics": [{"id": "accuracy", "goal": "maximize"}],
            "parameters": [
                {"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"},
                {"id": "optimizer", "type": "categorical", "values": ["adam", "sgd"], "children": [
                    {"when": ["sgd"], "parameters": [
                        {"id": "momentum", "type": "double", "min": 0.5, "max": 0.99}
                    ]}
                ]}
            ],
            "max_trials": 100,
            "parallel_trials": 5
        }))
        .await;
    let mut expected_momentum = Vec::new();
    for i in 0..30usize {
        let sgd = i < 8;
        let lr = 10f64.powf(-4.0 + 4.0 * i as f64 / 30.0);
        let mut parameters = json!({"lr": lr, "optimizer": if sgd { "sgd" } else { "adam" }});
        if sgd {
            parameters["momentum"] = json!(0.5 + 0.05 * i as f64);
        }
        expected_momentum.push(sgd.then_some(0.5 + 0.05 * i as f64));
        let r = app
            .post(
                &routes::trials(study),
                json!({"parameters": parameters, "final_measurement": {"metrics": {"accuracy": accuracy(lr)}}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let r = app.get(&routes::insights(study)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let sample = &r.body["sample"];
    let trials: Vec<i64> = sample["trial"]
        .as_array()
        .expect("trials")
        .iter()
        .filter_map(Json::as_i64)
        .collect();
    assert_eq!(trials.len(), 30, "every completed trial is in the sample");
    let axes = sample["parallel"].as_array().expect("parallel axes");
    let names: Vec<&str> = axes
        .iter()
        .filter_map(|a| a["parameter"].as_str())
        .collect();
    assert_eq!(names, ["lr", "optimizer", "momentum"]);
    let momentum = &axes[2];
    let at = momentum["inactive_at"].as_f64().expect("an inactive tick");
    assert!(at < 0.5, "below the axis' values: {momentum}");
    assert_eq!(momentum["range"][0].as_f64(), Some(at));
    assert_eq!(momentum["ticktext"][0], json!("inactive"));
    assert_eq!(momentum["tickvals"][0].as_f64(), Some(at));
    let values: Vec<f64> = momentum["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter_map(Json::as_f64)
        .collect();
    assert_eq!(values.len(), 30, "a number for every trial: {momentum}");
    for (trial, value) in trials.iter().zip(&values) {
        let row = usize::try_from(trial - 1).expect("trial ids from 1");
        match expected_momentum[row] {
            Some(m) => assert!((value - m).abs() < 1e-12, "trial {trial}: {value} vs {m}"),
            None => assert_eq!(*value, at, "trial {trial} (adam) is on the inactive tick"),
        }
    }
    // Axes where every trial has a value keep the chart's own ticks; lr is drawn as log10.
    assert_eq!(axes[0]["inactive_at"], Json::Null);
    assert_eq!(axes[0]["tickvals"], json!([]));
    assert_eq!(axes[0]["range"], json!([-4.0, 0.0]));
    assert_eq!(axes[1]["ticktext"], json!(["adam", "sgd"]));
}

#[tokio::test]
async fn insights_give_the_best_value_its_history_and_the_parameter_that_matters() {
    let app = spawn_app(sqlite_db()).await;
    let study = app.create_study(spec("insights", 500)).await;
    let acc = add_trials(&app, study, 200).await;
    let r = app.get(&routes::insights(study)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let best = acc.iter().copied().fold(f64::MIN, f64::max);
    assert_eq!(r.body["best"]["value"], json!(best));
    assert_eq!(r.body["completed"], json!(200));
    let steps: Vec<f64> = r.body["history"]["best_value"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(Json::as_f64)
        .collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
    assert_eq!(steps.last().copied(), Some(best));
    assert_eq!(
        r.body["importance"][0]["parameter"],
        json!("lr"),
        "{}",
        r.body["importance"]
    );
    assert_eq!(
        r.body["sample"]["trial"].as_array().map(Vec::len),
        Some(200)
    );

    let c = app
        .get(&format!("{}?x=lr&y=kernel", routes::contour(study)))
        .await;
    assert_eq!(c.status, StatusCode::OK, "{}", c.body);
    assert_eq!(c.body["grid"]["x"].as_array().map(Vec::len), Some(20));
    assert_eq!(c.body["grid"]["y"].as_array().map(Vec::len), Some(2));
    let bad = app
        .get(&format!("{}?x=lr&y=nope", routes::contour(study)))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.body["error"]["field"], json!("y"));
    let bad = app
        .get(&format!("{}?metric=loss", routes::insights(study)))
        .await;
    assert_eq!(bad.body["error"]["field"], json!("metric"));
    let missing = app.get("/v1/studies/999/insights").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn learning_curves_come_from_reported_measurements() {
    let app = spawn_app(sqlite_db()).await;
    let study = app.create_study(spec("curves", 10)).await;
    let s = app.post(&routes::suggest(study), json!({"count": 2})).await;
    for t in s.body["trials"].as_array().expect("trials") {
        let id = t["id"].as_i64().expect("id");
        for step in 1..=4 {
            let r = app
                .post(
                    &routes::trial_measurements(study, id),
                    json!({"step": step, "metrics": {"accuracy": 0.1 * step as f64}}),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        }
    }
    let r = app.get(&routes::curves(study)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let curves = r.body["curves"].as_array().expect("curves");
    assert_eq!(curves.len(), 2);
    assert_eq!(curves[0]["step"], json!([1, 2, 3, 4]));
    assert_eq!(curves[0]["early_stopped"], json!(false));
}

#[tokio::test]
async fn a_protected_server_sends_browsers_to_login_and_takes_the_cookie_for_reads_only() {
    let app = spawn_app_with(sqlite_db(), Some("s3cret-token")).await;
    let http = common::http_builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    // A browser asks for HTML; scripts and scrapers without a token keep getting 401.
    let r = http
        .get(app.url(&routes::study_page(3)))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = http
        .get(format!("{}?x=1", app.url(&routes::study_page(3))))
        .header("accept", "text/html,application/xhtml+xml")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        r.headers()["location"],
        "/login?next=%2Fstudies%2F3%3Fx%3D1"
    );
    for open in [
        "/login",
        "/dashboard/js/main.js",
        "/dashboard/vendor/xterm.js",
    ] {
        let r = http
            .get(format!("{}{open}", app.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::OK, "{open}");
    }
    // JSON clients still get 401, not a redirect.
    let r = http.get(app.url("/v1/studies")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);

    let r = http
        .post(format!("{}/login", app.base))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=s3cret-token&next=%2Fstudies%2F3")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/studies/3");
    let cookie = r.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().expect("pair").to_string();

    let r = http
        .get(app.url("/v1/studies"))
        .header("cookie", &pair)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .get(format!("{}/", app.base))
        .header("cookie", &pair)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    // A cookie rides along on cross-site requests: it never authorizes a change.
    let r = http
        .post(app.url("/v1/studies"))
        .header("cookie", &pair)
        .json(&spec("forged", 5))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = http
        .get(app.url("/v1/studies"))
        .header("cookie", "augur_token=wrong")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// Seeds the database at `AUGUR_BROWSER_DB` for `scripts/browser-test.sh`: a 60-trial study
/// with learning curves (some stopped early) and a two-metric study through the API, then
/// a study of `AUGUR_BROWSER_LARGE` trials (default 50,000) written in bulk through the
/// store, since 50,000 API calls would only measure the API; last a small study whose name
/// and categorical values are spreadsheet formulas and HTML.
#[tokio::test]
#[ignore = "a fixture for scripts/browser-test.sh, not a test"]
async fn seed_browser_fixture() {
    let url = std::env::var("AUGUR_BROWSER_DB").expect("AUGUR_BROWSER_DB");
    let large: i64 = std::env::var("AUGUR_BROWSER_LARGE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    // The server in-process on the fixture's own file (the helpers' databases are temporary).
    let config = augur::ServerConfig::new(url.clone(), "127.0.0.1:0".parse().expect("addr"));
    let server = augur::App::build(config).await.expect("server starts");
    let base = format!("http://{}", server.addr());
    tokio::spawn(server.run());
    let app = Seeder {
        http: common::http(),
        base,
    };

    // Study 1: small, through the API, with curves. Every fifth trial (from the 15th) learns
    // badly and asks `should_stop` after each step: the median rule stops it, for real.
    let mut small_spec = spec("svc-digits", 200);
    small_spec["early_stopping"] = json!({"rule": "median", "min_completed_trials": 5});
    // A conditional parameter: `rbf` trials have no `degree` (the parallel coordinates must
    // still draw them, on the axis' "inactive" tick).
    small_spec["parameters"][2]["children"] = json!([
        {"when": ["poly"], "parameters": [{"id": "degree", "type": "integer", "min": 2, "max": 5}]}
    ]);
    let small = app.create_study(small_spec).await;
    let mut stopped = 0;
    for i in 0..60usize {
        let lr = 10f64.powf(-4.0 + 4.0 * ((i * 37) % 60) as f64 / 60.0);
        let poor = i % 5 == 4 && i >= 14;
        let acc = if poor { 0.3 } else { 1.0 } * accuracy(lr);
        let mut parameters = json!({"lr": lr, "layers": 1 + (i % 8) as i64, "kernel": if i % 3 == 0 { "poly" } else { "rbf" }});
        if i % 3 == 0 {
            parameters["degree"] = json!(2 + (i % 4) as i64);
        }
        let s = app
            .post(&routes::trials(small), json!({ "parameters": parameters }))
            .await;
        assert_eq!(s.status, StatusCode::CREATED, "{}", s.body);
        let got = app
            .post(
                &routes::suggest(small),
                json!({"count": 1, "client_id": "seed"}),
            )
            .await;
        let id = got.body["trials"][0]["id"]
            .as_i64()
            .expect("suggested trial");
        for step in 1..=8 {
            let v = acc * (1.0 - (-(step as f64) / 2.0).exp());
            app.post(
                &routes::trial_measurements(small, id),
                json!({"step": step, "metrics": {"accuracy": v}}),
            )
            .await;
            if poor {
                let r = app
                    .post(&routes::trial_should_stop(small, id), json!({}))
                    .await;
                if r.body["should_stop"] == json!(true) {
                    stopped += 1;
                    break;
                }
            }
        }
        let r = app
            .post(&routes::trial_complete(small, id), json!({}))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(
            r.body["early_stopped"],
            json!(poor),
            "trial {id}: {}",
            r.body
        );
    }
    assert!(
        stopped >= 8,
        "the median rule stopped only {stopped} poor trials"
    );
    // Annotations (issue 27, item 10): the study's note and tags; every trial's training
    // loss as a user attribute, and a tag on the poly-kernel ones.
    let r = app
        .patch(
            &routes::study(small),
            json!({"note": "SVC on digits, first sweep", "tags": ["digits", "svc"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    for id in 1..=60i64 {
        let mut body = json!({"user_attrs": {"train_loss": 0.01 * id as f64}});
        if id % 3 == 1 {
            body["tags"] = json!(["poly-run"]);
        }
        let r = app.patch(&routes::trial(small, id), body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }

    // Study 2: two metrics, for the Pareto front.
    let mut two = spec("two-metrics", 100);
    two["metrics"] =
        json!([{"id": "accuracy", "goal": "maximize"}, {"id": "latency", "goal": "minimize"}]);
    let multi = app.create_study(two).await;
    for i in 0..40usize {
        let x = i as f64 / 40.0;
        app.post(&routes::trials(multi), json!({
            "parameters": {"lr": 0.001 + x * 0.5, "layers": 1 + (i % 8) as i64, "kernel": "rbf"},
            "final_measurement": {"metrics": {"accuracy": x.sqrt(), "latency": x + 0.1 * ((i * 7) % 5) as f64}}
        }))
        .await;
    }

    // Study 3: large, written in bulk.
    let big = app
        .create_study(spec("large-50k", large.max(1) + 100))
        .await;
    let store = augur::store::connect(&url).await.expect("store");
    let now = Utc::now();
    let mut next = 1i64;
    while next <= large {
        let last = (next + 4999).min(large);
        let mut tx = store
            .begin_study(StudyId::new(big))
            .await
            .expect("begin")
            .expect("study exists");
        let mut study = tx.study().clone();
        study.change_seq += 1;
        let mut trials = Vec::new();
        let mut rows = Vec::new();
        for id in next..=last {
            let u = ((id * 7919) % 10_007) as f64 / 10_007.0;
            let lr = 10f64.powf(-4.0 + 4.0 * u);
            let acc = accuracy(lr) + 0.02 * (((id * 31) % 17) as f64 / 17.0);
            let mut parameters = augur_optimizer::Assignment::new();
            parameters.insert("lr".into(), Value::Float(lr));
            parameters.insert("layers".into(), Value::Int(1 + id % 8));
            parameters.insert(
                "kernel".into(),
                Value::Str(if id % 3 == 0 { "poly" } else { "rbf" }.into()),
            );
            let fm = Measurement {
                step: 5,
                elapsed_secs: None,
                metrics: [("accuracy".to_string(), acc)].into(),
            };
            if id % 25 == 0 || id > large - 200 {
                for step in 1..=5 {
                    let mut m = fm.clone();
                    m.step = step;
                    m.metrics.insert(
                        "accuracy".into(),
                        acc * (1.0 - (-(step as f64) / 2.0).exp()),
                    );
                    rows.push((TrialId::new(id), m));
                }
            }
            trials.push(TrialRecord {
                study_id: StudyId::new(big),
                id: TrialId::new(id),
                state: TrialState::Completed,
                parameters,
                client_id: None,
                objective: Some(acc),
                final_measurement: Some(fm),
                infeasible_reason: None,
                fail_reason: None,
                early_stopped: id % 50 == 0,
                excluded: false,
                lease_expires_at: None,
                created_at: now,
                started_at: Some(now),
                completed_at: Some(now),
                change_seq: study.change_seq,
                attempts: 0,
                budget: None,
                lineage: None,
            });
        }
        tx.insert_trials(&trials).await.expect("insert");
        tx.upsert_measurements(&rows, now)
            .await
            .expect("measurements");
        study.next_trial_id = TrialId::new(last + 1);
        study.updated_at = now;
        // The study keeps its trials' counts (the service does, in every batch).
        for t in &trials {
            study.trial_counts.moved(None, t.state);
        }
        tx.update_study(&study).await.expect("study");
        tx.commit().await.expect("commit");
        next = last + 1;
    }

    // Study 4: what an attacker might type (issue 10, findings 8 and 9): a name and
    // categorical values that a spreadsheet would run as formulas or Plotly would draw as
    // HTML, and a metric whose values are negative numbers, which must stay numbers.
    // Trial 1 is labelled `=HYPERLINK(…)` and lost -0.5.
    let hostile = app.create_study(hostile_spec()).await;
    for i in 0..20usize {
        let label = HOSTILE_LABELS[i % HOSTILE_LABELS.len()];
        let r = app
            .post(
                &routes::trials(hostile),
                json!({
                    "parameters": {"x": -0.95 + 0.1 * i as f64, "label": label},
                    "final_measurement": {"metrics": {"loss": -0.5 + 0.01 * i as f64}}
                }),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    // Study 5: one trial run for real as a training cluster (a primary and two workers, each
    // saying who it is; the workers run until the primary ends after a second and they are
    // stopped), so the trial page has a log per replica.
    let runs = std::env::var("AUGUR_BROWSER_RUNS").map_or_else(
        |_| std::env::temp_dir().join(format!("augur-browser-runs-{}", std::process::id())),
        std::path::PathBuf::from,
    );
    let mut cluster_spec = spec("cluster", 1);
    cluster_spec["trial_job"] = json!({
        "command": ["/bin/sh", "-c", "echo \"replica $AUGUR_REPLICA says hello\"; [ \"$AUGUR_REPLICA\" = workerpool0-0 ] || exec sleep 60; printf weights > \"$AIP_MODEL_DIR/weights.bin\"; sleep 1; echo accuracy=0.5"],
        "worker_pools": [{"replicas": 1}, {"replicas": 2}],
        "output_dir": runs.display().to_string(),
    });
    let cluster = app.create_study(cluster_spec).await;
    let started = std::time::Instant::now();
    while app.get(&routes::study(cluster)).await.body["state"] != "completed" {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the cluster study did not complete"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Study 6: warm-started from study 1.
    let mut warm_spec = spec("warm", 10);
    warm_spec["prior_studies"] = json!([small]);
    let warm = app.create_study(warm_spec).await;
    // Study 7: every trial failed (the charts must say so, not draw empty axes).
    let failed = app.create_study(spec("all-failed", 10)).await;
    for _ in 0..3 {
        let got = app
            .post(
                &routes::suggest(failed),
                json!({"count": 1, "client_id": "seed-failed"}),
            )
            .await;
        let id = got.body["trials"][0]["id"]
            .as_i64()
            .expect("suggested trial");
        let r = app
            .post(
                &routes::trial_fail(failed, id),
                json!({"reason": "out of memory"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    // Study 8: population-based training run for real (4 trainers, 3 epochs, the worst
    // copying the best's checkpoint after each), so a trial page has a lineage.
    let pbt = app
        .create_study(json!({
            "name": "pbt",
            "algorithm": "random",
            "metrics": [{"id": "accuracy", "goal": "maximize"}],
            "parameters": [{"id": "lr", "type": "double", "min": 0.0001, "max": 1.0, "scale": "log"}],
            "max_trials": 4,
            "parallel_trials": 4,
            "seed": 3,
            "fidelity": {"argument": "epochs", "min": 1, "max": 3},
            "scheduler": "pbt",
            "trial_job": {
                "command": ["python3", "-c", PBT_TRAINER_PY],
                "output_dir": runs.join("pbt").display().to_string(),
            }
        }))
        .await;
    let started = std::time::Instant::now();
    while app.get(&routes::study(pbt)).await.body["state"] != "completed" {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the PBT study did not complete"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "seeded studies {small} (60 trials), {multi} (2 metrics), {big} ({large} trials), {hostile} (hostile labels), {cluster} (a cluster trial), {warm} (warm-started), {failed} (every trial failed), {pbt} (PBT)"
    );
}

/// The PBT study's trainer: its checkpoint is an accuracy that each epoch brings closer to 1,
/// fastest at lr 0.01; it resumes from the epochs its checkpoint holds.
const PBT_TRAINER_PY: &str = r#"
import argparse, json, math, os
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
p.add_argument("--epochs", type=int)
a = p.parse_args()
path = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "state.json")
state = json.load(open(path)) if os.path.exists(path) else {"epochs": 0, "acc": 0.0}
gain = 0.5 * math.exp(-math.log10(a.lr / 0.01) ** 2)
for epoch in range(state["epochs"] + 1, a.epochs + 1):
    state = {"epochs": epoch, "acc": 1 - (1 - state["acc"]) * (1 - gain)}
    json.dump(state, open(path, "w"))
print("epoch=%d accuracy=%.9f" % (state["epochs"], state["acc"]))
"#;

/// Categorical values of the hostile study: formulas, HTML links and tags, a number as text.
const HOSTILE_LABELS: [&str; 6] = [
    r#"=HYPERLINK("http://evil.example","x")"#,
    r#"<a href="http://evil.example">x</a>"#,
    "<b>bold</b>",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "-1",
    "plain",
];

/// A study named and labelled by an attacker (see `seed_browser_fixture`).
fn hostile_spec() -> Json {
    json!({
        "name": r#"<a href="http://evil.example">evil</a> =HYPERLINK("http://evil.example","x")"#,
        "algorithm": "random",
        "metrics": [{"id": "loss", "goal": "minimize"}],
        "parameters": [
            {"id": "x", "type": "double", "min": -1.0, "max": 1.0},
            {"id": "label", "type": "categorical", "values": HOSTILE_LABELS}
        ],
        "max_trials": 100,
        "seed": 5
    })
}

struct Seeder {
    http: reqwest::Client,
    base: String,
}

impl Seeder {
    async fn post(&self, path: &str, body: Json) -> common::Response {
        common::call(
            &self.http,
            &self.base,
            None,
            reqwest::Method::POST,
            path,
            Some(body),
        )
        .await
    }

    async fn patch(&self, path: &str, body: Json) -> common::Response {
        common::call(
            &self.http,
            &self.base,
            None,
            reqwest::Method::PATCH,
            path,
            Some(body),
        )
        .await
    }

    async fn get(&self, path: &str) -> common::Response {
        common::call(
            &self.http,
            &self.base,
            None,
            reqwest::Method::GET,
            path,
            None,
        )
        .await
    }

    async fn create_study(&self, spec: Json) -> i64 {
        let r = self.post("/v1/studies", spec).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        r.body["id"].as_i64().expect("study id")
    }
}
