//! Vertex AI's Vizier REST API (`api::vizier`), as the SDK sends it (`?$alt=json;
//! enum-encoding=int`, enums as numbers, int64 as strings), on SQLite and PostgreSQL: every
//! method, Vertex's error bodies (404, 409, 400 naming the field, 401, 403), a worker's
//! clientId asking again, the study's cap, and the study seen through Augur's own API. The
//! routes are kept out of openapi.yaml: their access is checked here instead of in roles.rs.

use crate::common::{self, routes, routes::vizier};

use augur::api::access::Access;
use augur::model::Role;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

on_both_backends!(
    every_method_answers_as_vertex_does,
    racing_creates_of_one_name_leave_one_study,
    bad_input_is_refused_naming_the_field,
    a_vizier_study_keeps_augurs_cap_and_budget,
    each_role_may_call_what_the_access_table_declares,
    a_vizier_study_stops_by_its_study_stopping_config,
);

/// Where the tests' studies are, as Vertex names a location.
const LOCATION: &str = "projects/demo/locations/us-central1";
const ADMIN: &str = "vizier-admin-token";

/// A call as the SDK makes it: int enum encoding asked in the query.
async fn vz(
    app: &common::TestApp,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> common::Response {
    let joint = if path.contains('?') { '&' } else { '?' };
    let path = format!("{path}{joint}$alt=json;enum-encoding=int");
    common::call(&app.http, &app.base, token, method, &path, body).await
}

fn spec() -> Value {
    json!({
        "metrics": [{"metricId": "acc", "goal": 1}],
        "parameters": [
            {"parameterId": "lr", "scaleType": 2, "doubleValueSpec": {"minValue": 0.0001, "maxValue": 1.0}},
            {"parameterId": "layers", "integerValueSpec": {"minValue": "1", "maxValue": "4"}},
            {"parameterId": "model", "categoricalValueSpec": {"values": ["linear", "tree"]},
             "conditionalParameterSpecs": [{
                 "parentCategoricalValues": {"values": ["tree"]},
                 "parameterSpec": {"parameterId": "depth", "integerValueSpec": {"minValue": "2", "maxValue": "6"}}
             }]}
        ],
        "algorithm": 3
    })
}

/// Create a study at LOCATION as `token`; its Vizier name and Augur id.
async fn create(app: &common::TestApp, token: Option<&str>, display: &str) -> (String, i64) {
    let r = vz(
        app,
        token,
        Method::POST,
        &vizier::studies(LOCATION),
        Some(json!({"displayName": display, "studySpec": spec()})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let name = r.body["name"].as_str().expect("name").to_string();
    let id = name
        .rsplit('/')
        .next()
        .and_then(|s| s.parse().ok())
        .expect("id");
    (name, id)
}

fn ids(trials: &Value) -> Vec<String> {
    let mut ids: Vec<String> = trials
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| t["id"].as_str().expect("int64 id as a string").to_string())
        .collect();
    ids.sort();
    ids
}

async fn every_method_answers_as_vertex_does(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let (name, id) = create(&app, None, "probe").await;
    let study = vizier::resource(&name);

    let got = vz(&app, None, Method::GET, &study, None).await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.body);
    assert_eq!(got.body["displayName"], "probe");
    assert_eq!(got.body["state"], 1, "ACTIVE as a number: {}", got.body);
    let stored = &got.body["studySpec"];
    assert_eq!(stored["metrics"][0]["goal"], 1);
    assert_eq!(stored["algorithm"], 3, "{stored}");
    assert_eq!(stored["parameters"][0]["scaleType"], 2, "{stored}");
    assert_eq!(stored["parameters"][1]["integerValueSpec"]["maxValue"], "4");
    let depth = &stored["parameters"][2]["conditionalParameterSpecs"][0];
    assert_eq!(depth["parameterSpec"]["parameterId"], "depth", "{stored}");
    // Without `enum-encoding=int`, enums are written by name.
    let named = common::call(&app.http, &app.base, None, Method::GET, &study, None).await;
    assert_eq!(named.body["state"], "ACTIVE");
    assert_eq!(named.body["studySpec"]["algorithm"], "RANDOM_SEARCH");

    // A display name is taken per project and location.
    let again = vz(
        &app,
        None,
        Method::POST,
        &vizier::studies(LOCATION),
        Some(json!({"displayName": "probe", "studySpec": spec()})),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert_eq!(again.body["error"]["status"], "ALREADY_EXISTS");
    assert_eq!(again.body["error"]["code"], 409);
    let elsewhere = vz(
        &app,
        None,
        Method::POST,
        &vizier::studies("projects/demo/locations/europe-west4"),
        Some(json!({"displayName": "probe", "studySpec": spec()})),
    )
    .await;
    assert_eq!(elsewhere.status, StatusCode::OK, "{}", elsewhere.body);
    let listed = vz(&app, None, Method::GET, &vizier::studies(LOCATION), None).await;
    let names: Vec<&str> = listed.body["studies"]
        .as_array()
        .expect("studies")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [name.as_str()],
        "only this location's: {}",
        listed.body
    );
    let found = vz(
        &app,
        None,
        Method::POST,
        &vizier::lookup_study(LOCATION),
        Some(json!({"displayName": "probe"})),
    )
    .await;
    assert_eq!(found.body["name"], name.as_str(), "{}", found.body);
    let missing = vz(
        &app,
        None,
        Method::POST,
        &vizier::lookup_study(LOCATION),
        Some(json!({"displayName": "nobody"})),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.body["error"]["status"], "NOT_FOUND");

    // Suggest: an operation answered done, its response typed.
    let suggest = |client: &'static str, count: i64| {
        let app = &app;
        let path = vizier::suggest_trials(&name);
        async move {
            vz(
                app,
                None,
                Method::POST,
                &path,
                Some(json!({"suggestionCount": count, "clientId": client})),
            )
            .await
        }
    };
    let op = suggest("w1", 3).await;
    assert_eq!(op.status, StatusCode::OK, "{}", op.body);
    assert_eq!(op.body["done"], true);
    let response = &op.body["response"];
    assert_eq!(
        response["@type"],
        "type.googleapis.com/google.cloud.aiplatform.v1.SuggestTrialsResponse"
    );
    assert_eq!(response["studyState"], 1);
    let first = ids(&response["trials"]);
    assert_eq!(first.len(), 3);
    for t in response["trials"].as_array().expect("trials") {
        assert_eq!(t["state"], 2, "ACTIVE: {t}");
        assert_eq!(t["clientId"], "w1");
        let params: Vec<&str> = t["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .filter_map(|p| p["parameterId"].as_str())
            .collect();
        let tree = t["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .any(|p| p["value"] == "tree");
        assert_eq!(params.contains(&"depth"), tree, "{t}");
    }
    // The same worker asking again gets its pending trials back.
    let resumed = suggest("w1", 3).await;
    assert_eq!(ids(&resumed.body["response"]["trials"]), first);
    // The operation is read back by its name, polled and waited on.
    let op_name = op.body["name"].as_str().expect("operation name");
    let op_path = vizier::resource(op_name);
    for (method, path) in [
        (Method::GET, op_path.clone()),
        (Method::POST, vizier::wait_operation(op_name)),
        (Method::GET, op_path.replacen("/v1/", "/ui/", 1)),
    ] {
        let polled = vz(&app, None, method, &path, None).await;
        assert_eq!(polled.status, StatusCode::OK, "{path}: {}", polled.body);
        assert_eq!(polled.body["done"], true);
        assert_eq!(ids(&polled.body["response"]["trials"]), first);
    }
    let cancel = vz(
        &app,
        None,
        Method::POST,
        &vizier::cancel_operation(op_name),
        None,
    )
    .await;
    assert_eq!(cancel.status, StatusCode::OK, "{}", cancel.body);
    let unknown_op = vz(
        &app,
        None,
        Method::GET,
        &format!("/v1/{name}/operations/x"),
        None,
    )
    .await;
    assert_eq!(unknown_op.status, StatusCode::NOT_FOUND);
    let beta = vz(
        &app,
        None,
        Method::POST,
        &format!("/v1beta1/{name}/trials:suggest"),
        Some(json!({"suggestionCount": 1, "clientId": "w2"})),
    )
    .await;
    assert_eq!(
        beta.body["response"]["@type"],
        "type.googleapis.com/google.cloud.aiplatform.v1beta1.SuggestTrialsResponse",
        "{}",
        beta.body
    );

    // A trial a client adds waits to be handed out.
    let made = vz(
        &app,
        None,
        Method::POST,
        &vizier::trials(&name),
        Some(json!({"parameters": [
            {"parameterId": "lr", "value": 0.01},
            {"parameterId": "layers", "value": 2},
            {"parameterId": "model", "value": "linear"}
        ]})),
    )
    .await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.body);
    assert_eq!(made.body["state"], 1, "REQUESTED: {}", made.body);
    let made_path = vizier::resource(made.body["name"].as_str().expect("trial name"));
    assert_eq!(
        vz(&app, None, Method::GET, &made_path, None).await.body["id"],
        made.body["id"]
    );

    let trial = |id: &str| format!("{name}/trials/{id}");
    let measured = vz(
        &app,
        None,
        Method::POST,
        &vizier::add_trial_measurement(trial(&first[0])),
        Some(
            json!({"measurement": {"stepCount": "5", "elapsedDuration": "1.5s",
            "metrics": [{"metricId": "acc", "value": 0.3}]}}),
        ),
    )
    .await;
    assert_eq!(measured.status, StatusCode::OK, "{}", measured.body);
    assert_eq!(measured.body["measurements"][0]["stepCount"], "5");
    assert_eq!(measured.body["measurements"][0]["elapsedDuration"], "1.5s");
    let check = vz(
        &app,
        None,
        Method::POST,
        &vizier::check_trial_early_stopping_state(trial(&first[0])),
        Some(json!({})),
    )
    .await;
    assert_eq!(check.body["done"], true, "{}", check.body);
    assert_eq!(check.body["response"]["shouldStop"], false);
    let check_path = vizier::resource(check.body["name"].as_str().expect("name"));
    assert_eq!(
        vz(&app, None, Method::GET, &check_path, None).await.body["response"]["shouldStop"],
        false
    );
    let completed = vz(
        &app,
        None,
        Method::POST,
        &vizier::complete_trial(trial(&first[0])),
        Some(json!({"finalMeasurement": {"stepCount": "6", "metrics": [{"metricId": "acc", "value": 0.9}]}})),
    )
    .await;
    assert_eq!(completed.body["state"], 4, "SUCCEEDED: {}", completed.body);
    assert_eq!(
        completed.body["finalMeasurement"]["metrics"][0]["value"],
        0.9
    );
    let stopped = vz(
        &app,
        None,
        Method::POST,
        &vizier::stop_trial(trial(&first[1])),
        Some(json!({})),
    )
    .await;
    assert_eq!(stopped.body["state"], 3, "STOPPING: {}", stopped.body);
    let infeasible = vz(
        &app,
        None,
        Method::POST,
        &vizier::complete_trial(trial(&first[2])),
        Some(json!({"trialInfeasible": true, "infeasibleReason": "diverged"})),
    )
    .await;
    assert_eq!(infeasible.body["state"], 5, "{}", infeasible.body);
    assert_eq!(infeasible.body["infeasibleReason"], "diverged");
    let again_done = vz(
        &app,
        None,
        Method::POST,
        &vizier::complete_trial(trial(&first[0])),
        Some(json!({})),
    )
    .await;
    assert_eq!(
        again_done.status,
        StatusCode::BAD_REQUEST,
        "{}",
        again_done.body
    );
    assert_eq!(again_done.body["error"]["status"], "FAILED_PRECONDITION");

    let optimal = vz(
        &app,
        None,
        Method::POST,
        &vizier::list_optimal_trials(&name),
        Some(json!({})),
    )
    .await;
    assert_eq!(ids(&optimal.body["optimalTrials"]), [first[0].clone()]);
    let all = vz(&app, None, Method::GET, &vizier::trials(&name), None).await;
    assert_eq!(
        all.body["trials"].as_array().map(Vec::len),
        Some(5),
        "{}",
        all.body
    );
    // Pages, as the SDK's pager follows them.
    let mut paged = Vec::new();
    let mut token = String::new();
    loop {
        let path = format!("{}?pageSize=2&pageToken={token}", vizier::trials(&name));
        let page = vz(&app, None, Method::GET, &path, None).await;
        assert!(
            page.body["trials"].as_array().is_some_and(|t| t.len() <= 2),
            "{}",
            page.body
        );
        paged.extend(ids(&page.body["trials"]));
        match page.body["nextPageToken"].as_str() {
            Some(next) => token = next.to_string(),
            None => break,
        }
    }
    paged.sort();
    assert_eq!(paged, ids(&all.body["trials"]));

    // Deleted through Vizier: gone from Vizier, kept (excluded) in Augur.
    let deleted = vz(&app, None, Method::DELETE, &made_path, None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
    assert_eq!(
        vz(&app, None, Method::GET, &made_path, None).await.status,
        StatusCode::NOT_FOUND
    );
    let made_id = made.body["id"].as_str().expect("id");
    let kept = app.get(&routes::trial(id, made_id)).await;
    assert_eq!(kept.body["excluded"], true, "{}", kept.body);

    // The study through Augur's own API.
    let augur = app.get(&routes::study(id)).await;
    assert_eq!(augur.body["name"], "probe");
    assert_eq!(augur.body["trial_counts"]["completed"], 1, "{}", augur.body);
    assert_eq!(augur.body["user_attrs"]["vertex.location"], "us-central1");
    assert!(
        app.get("/v1/studies").await.body["studies"]
            .as_array()
            .expect("studies")
            .iter()
            .any(|s| s["id"] == id)
    );

    let gone = vz(&app, None, Method::DELETE, &study, None).await;
    assert_eq!(gone.status, StatusCode::OK, "{}", gone.body);
    let after = vz(&app, None, Method::GET, &study, None).await;
    assert_eq!(after.status, StatusCode::NOT_FOUND);
    assert_eq!(after.body["error"]["status"], "NOT_FOUND");
}

/// A 400 in Vertex's body whose message and field violation name `field`.
fn assert_names_field(r: &common::Response, field: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{field}: {}", r.body);
    let error = &r.body["error"];
    assert_eq!(error["status"], "INVALID_ARGUMENT", "{}", r.body);
    assert_eq!(error["code"], 400);
    let message = error["message"].as_str().expect("message");
    assert!(message.contains(field), "{field} not in {message:?}");
    assert_eq!(
        error["details"][0]["fieldViolations"][0]["field"], field,
        "{}",
        r.body
    );
}

async fn bad_input_is_refused_naming_the_field(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let studies = vizier::studies(LOCATION);
    let post = |path: String, body: Value| {
        let app = &app;
        async move { vz(app, None, Method::POST, &path, Some(body)).await }
    };
    let mut no_goal = spec();
    no_goal["metrics"][0]["goal"] = json!(9);
    let mut inverted = spec();
    inverted["parameters"][0]["doubleValueSpec"]["minValue"] = json!(2.0);
    let mut bad_int = spec();
    bad_int["parameters"][1]["integerValueSpec"]["maxValue"] = json!("four");
    let mut no_progress_zero = spec();
    no_progress_zero["studyStoppingConfig"] = json!({"maxNumTrialsNoProgress": 0});
    let mut runtime = spec();
    runtime["studyStoppingConfig"] = json!({"maximumRuntimeConstraint": {"maxDuration": "60s"}});
    let cases = [
        (
            json!({"displayName": "x", "studySpec": no_progress_zero}),
            "studySpec.studyStoppingConfig.maxNumTrialsNoProgress",
        ),
        (
            json!({"displayName": "x", "studySpec": runtime}),
            "studySpec.studyStoppingConfig.maximumRuntimeConstraint",
        ),
        (json!({"studySpec": spec()}), "displayName"),
        (json!({"displayName": "x"}), "studySpec"),
        (
            json!({"displayName": "x", "studySpec": no_goal}),
            "studySpec.metrics[0].goal",
        ),
        (
            json!({"displayName": "x", "studySpec": bad_int}),
            "studySpec.parameters[1].integerValueSpec.maxValue",
        ),
    ];
    for (body, field) in cases {
        assert_names_field(&post(studies.clone(), body).await, field);
    }
    // Augur's own validation, in a Vizier answer: the field is named.
    let r = post(
        studies.clone(),
        json!({"displayName": "x", "studySpec": inverted}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("parameters[0]")),
        "{}",
        r.body
    );

    let (name, _) = create(&app, None, "bad-inputs").await;
    let suggest = vizier::suggest_trials(&name);
    let op = post(
        suggest.clone(),
        json!({"suggestionCount": 1, "clientId": "w"}),
    )
    .await;
    let trial = op.body["response"]["trials"][0]["name"]
        .as_str()
        .expect("trial");
    let measure = vizier::add_trial_measurement(trial);
    let cases = [
        (&suggest, json!({"clientId": "w"}), "suggestionCount"),
        (
            &suggest,
            json!({"suggestionCount": 0, "clientId": "w"}),
            "suggestionCount",
        ),
        (
            &suggest,
            json!({"suggestionCount": "many"}),
            "suggestionCount",
        ),
        (&measure, json!({}), "measurement"),
        (
            &measure,
            json!({"measurement": {"stepCount": "abc", "metrics": []}}),
            "measurement.stepCount",
        ),
        (
            &measure,
            json!({"measurement": {"elapsedDuration": "soon", "metrics": []}}),
            "measurement.elapsedDuration",
        ),
        (
            &vizier::trials(&name),
            json!({"parameters": [{"parameterId": "lr", "value": [1]}]}),
            "parameters[0].value",
        ),
    ];
    for (path, body, field) in cases {
        assert_names_field(&post(path.clone(), body).await, field);
    }
    // Not ids: 404, as for a study or trial that does not exist.
    for path in [
        format!("/v1/{LOCATION}/studies/abc"),
        format!("/v1/{name}/trials/x"),
        format!("/v1/{LOCATION}/studies/987654"),
    ] {
        let r = vz(&app, None, Method::GET, &path, None).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {}", r.body);
        assert_eq!(r.body["error"]["status"], "NOT_FOUND");
    }
    let huge = vz(
        &app,
        None,
        Method::GET,
        &format!("{}?pageSize=100000", vizier::trials(&name)),
        None,
    )
    .await;
    assert_names_field(&huge, "pageSize");
    let unknown_verb = post(format!("/v1/{trial}:explode"), json!({})).await;
    assert_eq!(
        unknown_verb.status,
        StatusCode::NOT_FOUND,
        "{}",
        unknown_verb.body
    );
}

async fn a_vizier_study_keeps_augurs_cap_and_budget(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let (name, id) = create(&app, None, "capped").await;
    let augur = app.get(&routes::study(id)).await.body;
    assert_eq!(
        augur["spec"]["max_trials"],
        augur::api::vizier::DEFAULT_MAX_TRIALS
    );
    assert_eq!(
        augur["spec"]["parallel_trials"],
        augur::api::vizier::DEFAULT_PARALLEL_TRIALS
    );
    let patched = app
        .call(
            Method::PATCH,
            &routes::study(id),
            Some(json!({"parallel_trials": 2})),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    let suggest = |client: &'static str| {
        let app = &app;
        let path = vizier::suggest_trials(&name);
        async move {
            vz(
                app,
                None,
                Method::POST,
                &path,
                Some(json!({"suggestionCount": 5, "clientId": client})),
            )
            .await
            .body
        }
    };
    let a = suggest("a").await;
    assert_eq!(ids(&a["response"]["trials"]).len(), 2, "the cap: {a}");
    let b = suggest("b").await;
    assert_eq!(
        ids(&b["response"]["trials"]).len(),
        0,
        "the cap is full: {b}"
    );
    // The worker holding the slots still gets its trials back.
    assert_eq!(
        ids(&suggest("a").await["response"]["trials"]),
        ids(&a["response"]["trials"])
    );
}

/// Who may call each Vizier route, as declared: reads a reader's, changes a writer's (and the
/// service asks for the study's creator).
fn expected_access(method: &str, template: &str) -> Access {
    let reads = method == "GET"
        || template.ends_with("studies:lookup")
        || template.ends_with("trials:listOptimalTrials")
        || template.ends_with("/operations/{operation}");
    if reads {
        Access::Role(Role::Reader)
    } else {
        Access::Role(Role::Writer)
    }
}

async fn each_role_may_call_what_the_access_table_declares(backend: &str) {
    // Every Vizier route is declared, as the rule says, and none is in Augur's spec.
    let table = augur::app::access_table();
    let openapi = augur::app::openapi_yaml();
    let vizier: Vec<(String, String, Access)> = table
        .entries()
        .filter(|(_, t, _)| augur::api::vizier::is_vizier_path(t))
        .map(|(m, t, a)| (m.to_string(), t.to_string(), a))
        .collect();
    // 9 paths x 2 versions + 2 operation paths under /ui/ (GET and POST each), methods apart.
    assert!(vizier.len() >= 30, "{vizier:?}");
    for (method, template, access) in &vizier {
        assert_eq!(
            *access,
            expected_access(method, template),
            "{method} {template}"
        );
        assert!(
            !openapi.contains(template.as_str()),
            "{template} in openapi.yaml"
        );
    }

    let app = common::spawn_app_with(common::db(backend).await, Some(ADMIN)).await;
    let mut tokens = std::collections::HashMap::new();
    for (name, role) in [
        ("reader", "reader"),
        ("owner", "writer"),
        ("other", "writer"),
    ] {
        let r = app
            .post("/v1/tokens", json!({"name": name, "role": role}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        tokens.insert(name, r.body["token"].as_str().expect("token").to_string());
    }
    let (reader, owner, other) = (
        Some(tokens["reader"].as_str()),
        Some(tokens["owner"].as_str()),
        Some(tokens["other"].as_str()),
    );
    let denied = |r: &common::Response| {
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert_eq!(r.body["error"]["status"], "PERMISSION_DENIED", "{}", r.body);
        assert_eq!(r.body["error"]["code"], 403);
    };
    let studies = vizier::studies(LOCATION);
    let body = json!({"displayName": "owned", "studySpec": spec()});
    denied(&vz(&app, reader, Method::POST, &studies, Some(body.clone())).await);
    let (name, _) = create(&app, owner, "owned").await;
    let study = vizier::resource(&name);
    let suggest = json!({"suggestionCount": 1, "clientId": "w"});
    let path = vizier::suggest_trials(&name);
    denied(&vz(&app, reader, Method::POST, &path, Some(suggest.clone())).await);
    denied(&vz(&app, other, Method::POST, &path, Some(suggest.clone())).await);
    let op = vz(&app, owner, Method::POST, &path, Some(suggest)).await;
    assert_eq!(op.status, StatusCode::OK, "{}", op.body);
    let trial = op.body["response"]["trials"][0]["name"]
        .as_str()
        .expect("trial");
    for who in [reader, other] {
        denied(
            &vz(
                &app,
                who,
                Method::POST,
                &vizier::complete_trial(trial),
                Some(json!({})),
            )
            .await,
        );
        denied(&vz(&app, who, Method::DELETE, &vizier::resource(trial), None).await);
        denied(&vz(&app, who, Method::DELETE, &study, None).await);
    }
    // A reader reads: the study, its trials, the lookup, the optimal trials, the operation.
    for (method, path, body) in [
        (Method::GET, study.clone(), None),
        (Method::GET, vizier::resource(trial), None),
        (Method::GET, vizier::trials(&name), None),
        (Method::GET, studies.clone(), None),
        (
            Method::POST,
            vizier::lookup_study(LOCATION),
            Some(json!({"displayName": "owned"})),
        ),
        (
            Method::POST,
            vizier::list_optimal_trials(&name),
            Some(json!({})),
        ),
        (
            Method::GET,
            vizier::resource(op.body["name"].as_str().expect("op")),
            None,
        ),
    ] {
        let r = vz(&app, reader, method.clone(), &path, body).await;
        assert_eq!(r.status, StatusCode::OK, "{method} {path}: {}", r.body);
    }
    // No token, or an unknown one: 401 in Vertex's body.
    for token in [None, Some("not-a-token")] {
        let r = vz(&app, token, Method::GET, &study, None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
        assert_eq!(r.body["error"]["status"], "UNAUTHENTICATED", "{}", r.body);
    }
    let done = vz(
        &app,
        owner,
        Method::POST,
        &vizier::complete_trial(trial),
        Some(json!({
        "finalMeasurement": {"metrics": [{"metricId": "acc", "value": 0.5}]}})),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let deleted = vz(&app, owner, Method::DELETE, &study, None).await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.body);
}

/// Workers starting together each create the study (the SDK's `create_or_load`): each one is
/// answered with a study or 409, and racers past the name check take their own study back.
async fn racing_creates_of_one_name_leave_one_study(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let body = json!({"displayName": "raced", "studySpec": spec()});
    let path = vizier::studies(LOCATION);
    let answers = futures::future::join_all(
        (0..6).map(|_| vz(&app, None, Method::POST, &path, Some(body.clone()))),
    )
    .await;
    let created: Vec<&Value> = answers
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .map(|r| &r.body["name"])
        .collect();
    for r in &answers {
        assert!(
            r.status == StatusCode::OK || r.body["error"]["status"] == "ALREADY_EXISTS",
            "{} {}",
            r.status,
            r.body
        );
    }
    let listed = vz(&app, None, Method::GET, &path, None).await;
    let left: Vec<&Value> = listed.body["studies"]
        .as_array()
        .expect("studies")
        .iter()
        .map(|s| &s["name"])
        .collect();
    assert!(!left.is_empty(), "{}", listed.body);
    // Every study left was answered to someone; none answered is gone unless it lost.
    assert!(
        left.iter().all(|n| created.contains(n)),
        "{left:?} vs {created:?}"
    );
    let found = vz(
        &app,
        None,
        Method::POST,
        &vizier::lookup_study(LOCATION),
        Some(json!({"displayName": "raced"})),
    )
    .await;
    assert_eq!(
        &found.body["name"], left[0],
        "the oldest is the one looked up"
    );
}

/// `studyStoppingConfig` through the Vizier API is Augur's `study_stopping`: kept, read back
/// in Vizier's form and Augur's, and it ends the study when a trial makes no progress.
async fn a_vizier_study_stops_by_its_study_stopping_config(backend: &str) {
    let app = common::spawn_app(common::db(backend).await).await;
    let mut study_spec = spec();
    study_spec["studyStoppingConfig"] =
        json!({"maxNumTrialsNoProgress": 1, "maxDurationNoProgress": "3600s"});
    let r = vz(
        &app,
        None,
        Method::POST,
        &vizier::studies(LOCATION),
        Some(json!({"displayName": "stopping", "studySpec": study_spec})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body["studySpec"]["studyStoppingConfig"],
        json!({"maxNumTrialsNoProgress": 1, "maxDurationNoProgress": "3600s"}),
        "{}",
        r.body
    );
    let name = r.body["name"].as_str().expect("name").to_string();
    let id: i64 = name
        .rsplit('/')
        .next()
        .and_then(|s| s.parse().ok())
        .expect("id");
    let own = app.get(&routes::study(id)).await.body;
    assert_eq!(
        own["spec"]["study_stopping"],
        json!({"max_num_trials_no_progress": 1, "max_duration_no_progress_secs": 3600}),
        "{own}"
    );
    // 0.9, then 0.5 (no progress on a maximized metric): the study completes.
    for acc in [0.9, 0.5] {
        let op = vz(
            &app,
            None,
            Method::POST,
            &vizier::suggest_trials(&name),
            Some(json!({"suggestionCount": 1, "clientId": "w"})),
        )
        .await;
        assert_eq!(op.status, StatusCode::OK, "{}", op.body);
        let trial = op.body["response"]["trials"][0]["name"]
            .as_str()
            .expect("a trial")
            .to_string();
        let done = vz(
            &app,
            None,
            Method::POST,
            &vizier::complete_trial(&trial),
            Some(json!({"finalMeasurement": {"metrics": [{"metricId": "acc", "value": acc}]}})),
        )
        .await;
        assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    }
    let own = app.get(&routes::study(id)).await.body;
    assert_eq!(own["state"], "completed", "{own}");
    let vizier = vz(&app, None, Method::GET, &vizier::resource(&name), None).await;
    assert_eq!(vizier.body["state"], 3, "COMPLETED: {}", vizier.body);
}
