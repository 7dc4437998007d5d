//! The tests' HTTP client: `call` sends JSON to any server and reads back a `Response`
//! (status and JSON body); `metric_sample` reads one line of a server's `/metrics`.

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// An HTTP client for the tests (reqwest asks for the process's TLS provider: `augur`
/// installs ring's, as its CLI does).
pub fn http() -> reqwest::Client {
    http_builder().build().expect("HTTP client")
}

pub fn http_builder() -> reqwest::ClientBuilder {
    augur::serve::install_tls_provider();
    reqwest::Client::builder()
}

pub struct Response {
    pub status: StatusCode,
    pub body: Value,
}

pub async fn call(
    http: &reqwest::Client,
    base: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Response {
    let mut request = http.request(method, format!("{base}{path}"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let text = response.text().await.expect("body read");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    };
    Response { status, body }
}

/// A sample of a server's `/metrics`: the value of the line that starts with `series`
/// (name and labels), 0 while the server has no such line.
pub async fn metric_sample(base: &str, token: Option<&str>, series: &str) -> f64 {
    let mut request = http().get(format!("{base}/metrics"));
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let text = request
        .send()
        .await
        .expect("metrics answered")
        .text()
        .await
        .expect("metrics read");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The JSON body of an unauthenticated GET of `path` on the server at `base`.
pub async fn get_body(http: &reqwest::Client, base: &str, path: &str) -> serde_json::Value {
    call(http, base, None, reqwest::Method::GET, path, None)
        .await
        .body
}
