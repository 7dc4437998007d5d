//! `openapi.yaml` is the committed snapshot of the spec the router generates: a route the
//! spec lacks, or a spec path the server does not route, fails here.

use crate::common;

use reqwest::{Method, StatusCode};

fn committed() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("openapi.yaml")
}

#[test]
fn committed_openapi_yaml_equals_the_generated_spec() {
    let generated = augur::app::openapi_yaml();
    assert!(
        committed() == generated,
        "openapi.yaml is stale: regenerate it with `cargo run -- openapi > openapi.yaml`"
    );
}

/// Every (path, method) of the spec, with path parameters filled in.
fn spec_operations() -> Vec<(Method, String)> {
    let doc: serde_json::Value = yaml_serde::from_str(&committed()).expect("openapi.yaml parses");
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            ops.push((method, path.replace("{study}", "1").replace("{trial}", "1")));
        }
    }
    ops
}

#[tokio::test]
async fn every_spec_operation_is_routed_and_every_route_is_in_the_spec() {
    let app = common::spawn_app(common::sqlite_db()).await;
    app.create_study(common::spec("random", 5, 1)).await;
    let ops = spec_operations();
    assert!(ops.len() >= 20, "the spec lists {} operations", ops.len());
    for (method, path) in &ops {
        let r = app
            .call(method.clone(), path, Some(serde_json::json!({})))
            .await;
        let unrouted = r.status == StatusCode::METHOD_NOT_ALLOWED
            || (r.status == StatusCode::NOT_FOUND && r.body["error"]["message"] == "no such route");
        assert!(
            !unrouted,
            "{method} {path} is in openapi.yaml but not routed: {} {}",
            r.status, r.body
        );
    }
    // The reverse: the spec is generated from the router, so a route outside the spec could
    // only come from a plain `.route(...)`, which the API code must not use.
    let api_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/api");
    for entry in std::fs::read_dir(api_dir).expect("src/api") {
        let path = entry.expect("entry").path();
        // `vizier/` is another protocol's API, kept out of Augur's spec on purpose; its routes
        // still declare their access (`AccessRouter::undocumented`, tests/api/vizier.rs).
        if path.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source");
        assert!(
            !text.contains(".route(\"") && !text.contains(".nest("),
            "{} registers a route outside the OpenAPI spec; use routes!(...)",
            path.display()
        );
    }
}
