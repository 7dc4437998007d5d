//! Bearer-token auth and roles. Tokens are stored as SHA-256 digests. A server bound to
//! loopback with no token configured is open (every caller is `open`, an admin); otherwise
//! every request but `/healthz` and `/readyz` needs a token, and what it may do follows
//! its role (`model::Role`): here, by route (a reader GETs, a writer also changes; tokens and
//! the audit trail are an admin's), and in the service, by what is asked (a `trial_job`
//! needs an operator; changing a study, asking it for trials or reporting to them needs its
//! creator or an admin). A trial token may only read and report to its own trial.
//!
//! An address that keeps sending wrong tokens is slowed down (`rate_limit::FailureLimit`).
//! The caller rides along in the request's extensions, for handlers to take as [`Actor`].

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, header::AUTHORIZATION};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::model::Role;
use crate::service::Caller;

/// The cookie a browser keeps the token in (set by the dashboard's `POST /login`).
pub const TOKEN_COOKIE: &str = "augur_token";

#[derive(Clone, Default)]
pub struct Auth {
    /// Open: bound to loopback with no token configured.
    pub open: bool,
}

impl Auth {
    pub fn new(open: bool) -> Self {
        Self { open }
    }
}

/// Who sent the request (the auth layer put it there): for handlers that record or check
/// who acts.
pub struct Actor(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Actor)
            .ok_or(ApiError::Unauthenticated)
    }
}

pub async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    // Only owned parts cross the await: a request body is not Sync.
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let authorization = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| cookie_token(&method, request.headers()));
    if is_public_dashboard_path(&path) || path == "/healthz" || path == "/readyz" {
        return next.run(request).await;
    }
    // Only a browser asking for a page is redirected; API clients and scrapers get 401.
    let wants_html = !path.starts_with("/v1/")
        && request
            .headers()
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/html"));
    // A token from an address that has sent too many wrong ones is not even looked at.
    let source = super::rate_limit::source_address(request.extensions());
    if authorization.is_some()
        && !state.auth.open
        && let Err(e) = state.failures.check(source)
    {
        return e.into_response();
    }
    let checked = check(&state, &method, &path, authorization.as_deref()).await;
    if authorization.is_some() && matches!(checked, Err(ApiError::Unauthenticated)) {
        state.failures.record_failure(source);
    }
    match checked {
        Ok(caller) => {
            // A replica forwarding a request has already taken it from the caller's limit.
            let from_peer = state
                .forwarder
                .as_ref()
                .is_some_and(|f| f.is_from_peer(request.headers()));
            if from_peer {
                request.extensions_mut().insert(super::forward::FromPeer);
            } else if let Err(e) = state.limits.admit(&caller.name) {
                return e.into_response();
            }
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        // A person opening a dashboard page is sent to the login form, not shown JSON.
        Err(ApiError::Unauthenticated) if method == Method::GET && wants_html => {
            let here = match request.uri().query() {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            let next: String = form_urlencoded::byte_serialize(here.as_bytes()).collect();
            axum::response::Redirect::to(&format!("/login?next={next}")).into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// The dashboard's login form, its sign-out and its static assets hold no data: anyone may
/// load them (a sign-in checks its token itself).
fn is_public_dashboard_path(path: &str) -> bool {
    path == "/login" || path == "/logout" || path.starts_with("/dashboard/")
}

/// The token from the dashboard's cookie, as a bearer header would carry it. Only for
/// reads: a cookie rides along on cross-site requests, so it must never authorize a change.
fn cookie_token(method: &Method, headers: &axum::http::HeaderMap) -> Option<String> {
    if !matches!(*method, Method::GET | Method::HEAD) {
        return None;
    }
    let prefix = format!("{TOKEN_COOKIE}=");
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(prefix.as_str()).map(str::to_string))
        .filter(|t| !t.is_empty())
        .map(|t| format!("Bearer {t}"))
}

async fn check(
    state: &AppState,
    method: &Method,
    path: &str,
    authorization: Option<&str>,
) -> Result<Caller, ApiError> {
    if state.auth.open {
        return Ok(Caller::open());
    }
    let token = authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(ApiError::Unauthenticated)?;
    let caller = state
        .service
        .authenticate(token)
        .await?
        .ok_or(ApiError::Unauthenticated)?;
    match caller.trial_scope {
        Some((study, trial)) if trial_route(method, path) == Some((study, trial)) => {
            return Ok(caller);
        }
        Some(_) => {
            return Err(ApiError::denied(
                "this token may only report to its own trial",
            ));
        }
        None => {}
    }
    let needed = required_role(method, path);
    if caller.role < needed {
        return Err(ApiError::denied(format!(
            "{method} {path} needs a {needed} token; {:?} is a {}",
            caller.name, caller.role
        )));
    }
    Ok(caller)
}

/// The least role a route takes, whatever its study: tokens and the audit trail are an
/// admin's; every other read a reader's; every other change a writer's (the service asks
/// more of some: an operator for a `trial_job`, the creator or an admin to change a study,
/// ask it for trials or report to them).
pub fn required_role(method: &Method, path: &str) -> Role {
    let admin_only = ["/v1/tokens", "/v1/audit"]
        .iter()
        .any(|p| path == *p || path.starts_with(&format!("{p}/")));
    if admin_only {
        Role::Admin
    } else if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        Role::Reader
    } else {
        Role::Writer
    }
}

/// `(study, trial)` if this request reads or reports to one trial: GET of the trial or its
/// should_stop, PATCH of the trial (its user attributes), POST of its
/// measurements/complete/fail/heartbeat/should_stop.
fn trial_route(method: &Method, path: &str) -> Option<(i64, i64)> {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let (study, trial, action) = match parts.as_slice() {
        ["", "v1", "studies", s, "trials", t] => (s, t, None),
        ["", "v1", "studies", s, "trials", t, a] => (s, t, Some(*a)),
        _ => return None,
    };
    let allowed = matches!(
        (method, action),
        (&Method::GET, None | Some("should_stop"))
            // PATCH: its user attributes only (the service refuses the rest to a trial token)
            | (&Method::PATCH, None)
            | (
                &Method::POST,
                Some("measurements" | "complete" | "fail" | "heartbeat" | "should_stop")
            )
    );
    if !allowed {
        return None;
    }
    Some((study.parse().ok()?, trial.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trial_tokens_reach_only_their_trials_reporting_routes() {
        assert_eq!(
            trial_route(&Method::POST, "/v1/studies/3/trials/7/complete"),
            Some((3, 7))
        );
        assert_eq!(
            trial_route(&Method::GET, "/v1/studies/3/trials/7"),
            Some((3, 7))
        );
        assert_eq!(
            trial_route(&Method::POST, "/v1/studies/3/trials/7/should_stop"),
            Some((3, 7))
        );
        assert_eq!(
            trial_route(&Method::PATCH, "/v1/studies/3/trials/7"),
            Some((3, 7))
        );
        assert_eq!(trial_route(&Method::POST, "/v1/studies/3/suggest"), None);
        assert_eq!(trial_route(&Method::DELETE, "/v1/studies/3"), None);
        assert_eq!(
            trial_route(&Method::POST, "/v1/studies/3/trials/7/exclude"),
            None
        );
        assert_eq!(
            trial_route(&Method::POST, "/v1/studies/3/trials/7/token"),
            None,
            "a trial token cannot mint the next one"
        );
    }

    #[test]
    fn routes_need_a_reader_to_read_a_writer_to_change_and_an_admin_for_tokens() {
        assert_eq!(required_role(&Method::GET, "/v1/studies"), Role::Reader);
        assert_eq!(required_role(&Method::GET, "/"), Role::Reader);
        assert_eq!(
            required_role(&Method::POST, "/v1/studies/1/suggest"),
            Role::Writer
        );
        assert_eq!(
            required_role(&Method::DELETE, "/v1/studies/1"),
            Role::Writer
        );
        assert_eq!(required_role(&Method::GET, "/v1/tokens"), Role::Admin);
        assert_eq!(required_role(&Method::DELETE, "/v1/tokens/ci"), Role::Admin);
        assert_eq!(required_role(&Method::GET, "/v1/audit"), Role::Admin);
        assert_eq!(required_role(&Method::GET, "/v1/tokensx"), Role::Reader);
    }
}
