//! What a web browser may ask of this server. A page from any site can make the user's
//! browser send requests here, so two rules hold before auth is even asked (on
//! [`refuse_foreign_requests`]).

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::model::request::is_loopback_host;

/// - a request that changes something (any method but GET, HEAD, OPTIONS) coming from a page
///   of another origin (its `Origin` header), or that the browser says comes from another
///   site (`Sec-Fetch-Site: cross-site` or `same-site`, with or without `Origin`), is
///   refused: without it, a drive-by page could stop or delete studies, create one whose
///   `trial_job` runs a command, or sign the user in or out of the dashboard;
/// - a server that runs open (loopback, no token) answers only loopback host names: a page
///   whose own name an attacker re-points at 127.0.0.1 (DNS rebinding) reaches this server
///   as its "same origin", with `Host: evil.example`.
///
/// JSON bodies must also say they are JSON (`ApiJson` answers 415), because a page can send
/// `text/plain` or no Content-Type at all without asking the server first (no preflight).
pub async fn refuse_foreign_requests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let host = request_host(&request);
    let verdict = check(
        state.auth.open,
        request.method(),
        request.uri().path(),
        host.as_deref(),
        request.headers(),
        &state.public_url,
    );
    match verdict {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// The name the client asked for: `Host` (HTTP/1.1), or the URI's authority (HTTP/2).
fn request_host(request: &Request) -> Option<String> {
    request
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_string()))
}

fn check(
    open: bool,
    method: &Method,
    path: &str,
    host: Option<&str>,
    headers: &HeaderMap,
    public_url: &str,
) -> Result<(), ApiError> {
    // Liveness and readiness probes carry whatever name their prober uses and reveal nothing.
    let probe = path == "/healthz" || path == "/readyz";
    if open && !probe && !host.is_some_and(is_loopback_host) {
        return Err(ApiError::denied(format!(
            "this server runs without tokens and answers only loopback names (localhost, \
             127.0.0.1, [::1]), not Host {}",
            host.unwrap_or("(none)")
        )));
    }
    // A WebSocket (a session in a trial, `api::exec`) runs commands: a GET that changes
    // what a page may not.
    let changes_state =
        !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) || is_websocket(headers);
    if changes_state && let Some(site) = foreign_site(headers) {
        return Err(ApiError::denied(format!(
            "a page of another site (Sec-Fetch-Site: {site}) may not change anything here"
        )));
    }
    if changes_state && let Some(origin) = headers.get(ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let own = host.is_some_and(|h| same_authority(origin, h))
            || url::Url::parse(public_url)
                .ok()
                .is_some_and(|u| u.origin().ascii_serialization() == origin);
        if !own {
            return Err(ApiError::denied(format!(
                "a page of another origin ({origin}) may not change anything here"
            )));
        }
    }
    Ok(())
}

/// Whether the request asks to become a WebSocket (`Upgrade: websocket`).
pub(super) fn is_websocket(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::UPGRADE)
        .iter()
        .any(|v| {
            v.to_str()
                .is_ok_and(|v| v.eq_ignore_ascii_case("websocket"))
        })
}

/// `Sec-Fetch-Site` when a browser says the request comes from a page of another site or
/// of a sibling subdomain or port (`same-site`, another origin all the same); `None` for
/// this server's own pages (`same-origin`), a request the user made (`none`), and clients
/// that send no such header.
fn foreign_site(headers: &HeaderMap) -> Option<String> {
    let site = headers.get("sec-fetch-site")?.to_str().unwrap_or("invalid");
    match site {
        "same-origin" | "none" => None,
        other => Some(other.to_string()),
    }
}

/// Whether `origin` (`scheme://host[:port]`) names the authority `host` (`host[:port]`), the
/// scheme's default port being implied where either leaves it out.
fn same_authority(origin: &str, host: &str) -> bool {
    let Ok(origin) = url::Url::parse(origin) else {
        return false; // "null" (sandboxed frames, file: pages) and anything malformed
    };
    let Ok(asked) = url::Url::parse(&format!("{}://{host}", origin.scheme())) else {
        return false;
    };
    origin.host() == asked.host() && origin.port_or_known_default() == asked.port_or_known_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_is_own_only_with_the_same_host_and_port() {
        assert!(same_authority("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_authority("http://augur.example", "augur.example:80"));
        assert!(same_authority("https://augur.example", "AUGUR.example"));
        assert!(!same_authority("http://127.0.0.1:8081", "127.0.0.1:8080"));
        assert!(!same_authority("http://evil.example", "127.0.0.1:8080"));
        assert!(!same_authority("null", "127.0.0.1:8080"));
    }

    /// A WebSocket runs commands in a trial (`api::exec`): a page of another origin may not
    /// open one, though its method is GET; the server's own pages and clients without
    /// `Origin` may.
    #[test]
    fn a_websocket_from_another_origin_is_refused_like_a_change() {
        let headers = |origin: &str| {
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::header::UPGRADE,
                "websocket".parse().expect("value"),
            );
            if !origin.is_empty() {
                h.insert(ORIGIN, origin.parse().expect("value"));
            }
            h
        };
        let path = "/v1/studies/1/trials/1/exec";
        let host = Some("127.0.0.1:8080");
        let url = "http://127.0.0.1:8080";
        let get = &Method::GET;
        assert!(check(false, get, path, host, &headers("http://evil.example"), url).is_err());
        assert!(
            check(
                false,
                get,
                path,
                host,
                &headers("http://127.0.0.1:8080"),
                url
            )
            .is_ok()
        );
        assert!(check(false, get, path, host, &headers(""), url).is_ok());
        let mut plain = headers("http://evil.example");
        plain.remove(axum::http::header::UPGRADE);
        assert!(
            check(false, get, path, host, &plain, url).is_ok(),
            "a plain GET is a read"
        );
    }
}
