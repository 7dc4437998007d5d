//! The role table, over every route the server has: each route's declaration (`api::access`)
//! must say what the table below says, and each path and method of the OpenAPI document (the
//! router is the spec) is called with a token of each role, on SQLite and on PostgreSQL, and
//! must be refused with 403 exactly where the table says, and never answer 401 (the tokens
//! are valid) nor 5xx.
//!
//! | route                                            | reader | writer (creator) | operator | admin | trial token |
//! |--------------------------------------------------|--------|------------------|----------|-------|-------------|
//! | every GET (API, dashboard, /metrics, openapi)    | yes    | yes              | yes      | yes   | its trial only |
//! | GET /v1/tokens, GET /v1/audit                    | 403    | 403              | 403      | yes   | 403         |
//! | POST/DELETE /v1/tokens…                          | 403    | 403              | 403      | yes   | 403         |
//! | POST /v1/studies                                 | 403    | yes              | yes      | yes   | 403         |
//! | suggest, add a trial, a trial's reports          | 403    | yes (its own)    | 403      | yes   | its trial's reports only |
//! | PATCH/DELETE a study, stop it                    | 403    | yes (its own)    | 403      | yes   | 403         |
//! | PATCH a trial                                    | 403    | yes (its own)    | 403      | yes   | its user attributes |
//! | POST …/parameters (grow the search space)        | 403    | yes (its own)    | 403      | yes   | 403         |
//! | POST …/trials/{trial}/token                      | 403    | yes (its own)    | 403      | yes   | 403         |
//! | GET …/trials/{trial}/exec (a WebSocket session)  | 403    | yes (its own)    | 403      | yes   | 403         |
//! | PUT /v1/pools/{pool}/workers/{worker}, POST …/lease (a pool worker runs trials) | 403 | 403 | yes | yes | 403 |
//!
//! The study is the writer's: the operator stands for every other writer, whose asks and
//! tells to another's study are refused (issue 26, finding 8).
//! | /login, /logout, /dashboard/*, /healthz, /readyz | yes    | yes              | yes      | yes   | yes         |
//!
//! (A `trial_job` needs an operator: `tokens.rs` checks that; here the bodies are `{}` or the
//! least a route needs to parse, so that a refusal is about who asks.)

use crate::common::{self, routes};

use augur::api::access::{Access, RouteAccess};
use augur::model::Role;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

on_both_backends!(every_route_answers_each_role_as_the_table_says);

/// Each route declares who may call it where it is registered (`api::access`): every
/// route of the document has a declaration, and it says what the table above says (but for
/// the creator rule, which the service applies: an operator is a writer to the route).
#[test]
fn every_route_declares_who_may_call_it_as_the_table_says() {
    let table = augur::app::access_table();
    let mut undeclared = Vec::new();
    let mut differs = Vec::new();
    for (method, path) in operations() {
        match table.lookup(&method, Some(&path)) {
            RouteAccess::Declared(access) => {
                for who in EVERYONE {
                    let declared = match (access, who) {
                        (Access::Public, _) => true,
                        (Access::RoleOrOwnTrial(_), Who::Trial) => true,
                        (_, Who::Trial) => false,
                        (Access::Role(role) | Access::RoleOrOwnTrial(role), _) => {
                            role_of(who) >= role
                        }
                    };
                    let expected = allowed(who, &method, &path) || who == Who::Operator && declared;
                    if declared != expected {
                        differs.push(format!("{method} {path}: {who:?} declared {declared}"));
                    }
                }
            }
            other => undeclared.push(format!("{method} {path}: {other:?}")),
        }
    }
    assert!(
        undeclared.is_empty(),
        "routes without a declaration: {undeclared:?}"
    );
    assert!(
        differs.is_empty(),
        "declarations unlike the table: {differs:?}"
    );
    assert!(table.entries().count() >= 40, "{}", table.entries().count());
}

fn role_of(who: Who) -> Role {
    match who {
        Who::Reader | Who::Trial => Role::Reader,
        Who::Writer => Role::Writer,
        Who::Operator => Role::Operator,
        Who::Admin => Role::Admin,
    }
}

const ADMIN: &str = "role-table-admin";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Reader,
    Writer,
    Operator,
    Admin,
    Trial,
}

/// Those refused a route ask before those allowed it (a study deleted by its writer is gone
/// for the operator's try).
const EVERYONE: [Who; 5] = [
    Who::Reader,
    Who::Trial,
    Who::Operator,
    Who::Writer,
    Who::Admin,
];

/// Whether the table lets `who` call `method path` (path as the document writes it).
fn allowed(who: Who, method: &Method, path: &str) -> bool {
    let public = ["/login", "/logout", "/healthz", "/readyz"].contains(&path)
        || path.starts_with("/dashboard/");
    if public {
        return true;
    }
    if who == Who::Trial {
        let own_trial = path.starts_with("/v1/studies/{study}/trials/{trial}");
        let action = path.rsplit('/').next().unwrap_or("");
        return own_trial
            && match *method {
                Method::GET => path.ends_with("{trial}") || action == "should_stop",
                // Its user attributes (the service refuses it the rest of a PATCH).
                Method::PATCH => path.ends_with("{trial}"),
                Method::POST => [
                    "measurements",
                    "complete",
                    "fail",
                    "heartbeat",
                    "should_stop",
                    // A pool worker's PBT copy, reported with the trial's token.
                    "checkpoint_copied",
                ]
                .contains(&action),
                _ => false,
            };
    }
    if path.starts_with("/v1/tokens") || path == "/v1/audit" {
        return who == Who::Admin;
    }
    // A session in a trial (a WebSocket's GET) runs commands there: a change of the study.
    if *method == Method::GET && !path.ends_with("/exec") {
        return true;
    }
    // A pool's workers run trials of any study in the pool: an operator's or an admin's.
    if path.starts_with("/v1/pools/") {
        return matches!(who, Who::Operator | Who::Admin);
    }
    if who == Who::Reader {
        return false;
    }
    // Creating a study is any writer's; every other change under it (asking it for trials,
    // reporting to them) its creator's (the writer here) or an admin's.
    let creates = *method == Method::POST && path == "/v1/studies";
    creates || who != Who::Operator
}

/// Every (method, path) of the OpenAPI document, DELETE last and the study's own deletion
/// very last (so that the study and its trials' tokens are there for the rest), and the
/// reports that end a trial after the others.
fn operations() -> Vec<(Method, String)> {
    let doc: Value = yaml_serde::from_str(&augur::app::openapi_yaml()).expect("OpenAPI YAML");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in ["get", "post", "put", "patch", "delete"] {
            if item.get(method).is_some() {
                let m = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
                ops.push((m, path.clone()));
            }
        }
    }
    let rank = |(m, p): &(Method, String)| {
        let ends = p.ends_with("/complete") || p.ends_with("/fail");
        let deletes_study = *m == Method::DELETE && p == "/v1/studies/{study}";
        (*m == Method::DELETE, deletes_study, ends, p.clone())
    };
    ops.sort_by_key(rank);
    ops
}

async fn every_route_answers_each_role_as_the_table_says(backend: &str) {
    let app = common::spawn_app_with(common::db(backend).await, Some(ADMIN)).await;
    let mut tokens = std::collections::HashMap::new();
    for (who, name, role) in [
        (Who::Reader, "reader", "reader"),
        (Who::Writer, "owner", "writer"),
        (Who::Operator, "ops", "operator"),
        (Who::Admin, "admin2", "admin"),
    ] {
        let r = app
            .post("/v1/tokens", json!({"name": name, "role": role}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        tokens.insert(
            format!("{who:?}"),
            r.body["token"].as_str().expect("token").to_string(),
        );
        // One to revoke per role, for DELETE /v1/tokens/{name}.
        app.post(
            "/v1/tokens",
            json!({"name": format!("victim-{name}"), "role": "reader"}),
        )
        .await;
    }
    let as_who = |who: Who, method: Method, path: String, body: Option<Value>| {
        let token = tokens.get(&format!("{who:?}")).cloned();
        let app = &app;
        async move { common::call(&app.http, &app.base, token.as_deref(), method, &path, body).await }
    };
    let mut spec = common::spec("random", 1000, 200);
    spec["name"] = json!("role-table");
    let created = as_who(Who::Writer, Method::POST, "/v1/studies".into(), Some(spec)).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let study = created.body["id"].as_i64().expect("id");
    let suggested = as_who(
        Who::Writer,
        Method::POST,
        routes::suggest(study),
        Some(json!({"count": 1, "client_id": "owner-client"})),
    )
    .await;
    assert_eq!(suggested.body["trials"][0]["id"], 1, "{}", suggested.body);

    // A trial token works on a trial of its own, still running: one fresh trial and token for
    // each route, made before any route could stop the study.
    let operations = operations();
    let mut trial_tokens = Vec::new();
    for i in 0..operations.len() {
        let client = format!("t{i}");
        let s = as_who(
            Who::Writer,
            Method::POST,
            routes::suggest(study),
            Some(json!({"count": 1, "client_id": client})),
        )
        .await;
        let trial = s.body["trials"][0]["id"].as_i64().expect("trial");
        let t = as_who(
            Who::Writer,
            Method::POST,
            routes::trial_token(study, trial),
            Some(json!({"client_id": client})),
        )
        .await;
        assert_eq!(t.status, StatusCode::CREATED, "{}", t.body);
        trial_tokens.push((trial, t.body["token"].as_str().expect("token").to_string()));
    }

    let mut table: Vec<(String, Vec<u16>)> = Vec::new();
    let mut wrong = Vec::new();
    for (i, (method, path)) in operations.into_iter().enumerate() {
        let mut row = Vec::new();
        for who in EVERYONE {
            let name = match who {
                Who::Reader => "victim-reader",
                Who::Writer => "victim-owner",
                Who::Operator => "victim-ops",
                Who::Admin | Who::Trial => "victim-admin2",
            };
            let (trial, token) = if who == Who::Trial {
                let (trial, token) = &trial_tokens[i];
                (*trial, Some(token.clone()))
            } else {
                (1, None)
            };
            let concrete = path
                .replace("{study}", &study.to_string())
                .replace("{trial}", &trial.to_string())
                .replace("{name}", name)
                .replace("{pool}", "role-table")
                .replace("{worker}", "w");
            // Bodies that parse, so that a refusal is about who asks, not what: `{}` but for
            // the one change that needs a field.
            let body = match method {
                Method::PATCH if path.ends_with("{trial}") => {
                    Some(json!({"user_attrs": {"seen_by": "the role table"}}))
                }
                Method::POST if path.ends_with("/measurements") => {
                    Some(json!({"step": 0, "metrics": {}}))
                }
                Method::POST if path.ends_with("/token") => {
                    Some(json!({"client_id": "owner-client"}))
                }
                Method::POST if path.ends_with("{study}/trials") => Some(json!({"parameters": {}})),
                Method::POST if path.ends_with("/parameters") => Some(json!({
                    "parameter": {"id": "grown", "type": "double", "min": 0, "max": 1}
                })),
                Method::POST | Method::PATCH | Method::PUT => Some(json!({})),
                _ => None,
            };
            let r = match token {
                Some(token) => {
                    common::call(
                        &app.http,
                        &app.base,
                        Some(&token),
                        method.clone(),
                        &concrete,
                        body,
                    )
                    .await
                }
                None => as_who(who, method.clone(), concrete.clone(), body).await,
            };
            let status = r.status.as_u16();
            row.push(status);
            let ok = if allowed(who, &method, &path) {
                status != 401 && status != 403 && status < 500
            } else {
                status == 403
            };
            if !ok {
                wrong.push(format!("{who:?} {method} {concrete}: {status} {}", r.body));
            }
        }
        table.push((format!("{method} {path}"), row));
    }
    let mut printed = String::from(
        "| route | reader | trial token | operator | writer (creator) | admin |\n|---|---|---|---|---|---|\n",
    );
    for (route, row) in &table {
        let cells: Vec<String> = row.iter().map(u16::to_string).collect();
        printed.push_str(&format!("| {route} | {} |\n", cells.join(" | ")));
    }
    eprintln!("role table on {backend}:\n{printed}");
    assert!(
        table.len() >= 30,
        "the document lists every route: {}",
        table.len()
    );
    assert!(
        wrong.is_empty(),
        "not as the table says:\n{}",
        wrong.join("\n")
    );
}
