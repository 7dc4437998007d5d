//! Bearer-token auth and roles: who a request's caller is ([`Actor`]) and whether the route
//! it matched lets it in (declared where the route was registered, `access`).

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, header::AUTHORIZATION};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::access::{Access, RouteAccess, trial_of_path};
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

/// Bearer-token auth and roles. Tokens are stored as SHA-256 digests. A server bound to
/// loopback with no token configured is open (every caller is `open`, an admin); otherwise
/// each route needs what it declared where it was registered (`access`): nothing (health
/// probes, the login form, assets), a role (a reader GETs, a writer also changes; tokens and
/// the audit trail are an admin's), or that role or the trial's own token. The service asks
/// more by what is asked (a `trial_job` needs an operator; changing a study, asking it for
/// trials or reporting to them needs its creator or an admin).
///
/// The token comes in `Authorization: Bearer`; the dashboard's cookie stands for it on reads
/// only; a WebSocket to the exec route (a browser cannot set a header on one) may offer it as a
/// subprotocol instead ([`BEARER_SUBPROTOCOL`]), never the cookie.
///
/// An address that keeps sending wrong tokens is slowed down (`rate_limit::FailureLimit`).
/// The caller rides along in the request's extensions, for handlers to take as [`Actor`].
pub async fn require_token(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    // Only owned parts cross the await: a request body is not Sync.
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    // Who may call it is the matched route's declaration (`access`); a path or method that
    // matches none needs a valid token before it hears 404 or 405.
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string());
    let authorization = match offered_token(&state, &method, template.as_deref(), &request) {
        Ok(authorization) => authorization,
        Err(refused) => return refused.into_response(),
    };
    let access = match route_access(&state, &method, template.as_deref(), &path) {
        Ok(Access::Public) => return next.run(request).await,
        Ok(access) => access,
        Err(refused) => return refused.into_response(),
    };
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
    let route = Route {
        method: &method,
        path: &path,
        template: template.as_deref(),
        access,
    };
    let checked = check(&state, &route, authorization.as_deref()).await;
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

/// The token `request` offers, as an `Authorization` value: its header, else (the exec
/// route alone) a subprotocol's, else the dashboard cookie on a read. A malformed
/// subprotocol token is refused, and counts as a failure of its address.
fn offered_token(
    state: &AppState,
    method: &Method,
    template: Option<&str>,
    request: &Request,
) -> Result<Option<String>, ApiError> {
    let header = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // A browser's WebSocket carries no Authorization header: the exec route alone takes the
    // token from the subprotocols the client offers (as Kubernetes does), never the cookie.
    let offered = match header {
        None if template == Some(super::exec::ROUTE) => subprotocol_token(request.headers()),
        _ => Ok(None),
    };
    match offered {
        Ok(token) => Ok(header
            .or_else(|| token.map(|t| format!("Bearer {t}")))
            .or_else(|| cookie_token(method, request.headers()))),
        Err(e) => {
            let source = super::rate_limit::source_address(request.extensions());
            if !state.auth.open {
                state.failures.check(source)?;
                state.failures.record_failure(source);
            }
            Err(e)
        }
    }
}

/// Who may call the route `template` matched (`None`: none did), as it declared; a route
/// that declares nothing is refused to everyone.
fn route_access(
    state: &AppState,
    method: &Method,
    template: Option<&str>,
    path: &str,
) -> Result<Access, ApiError> {
    match state.access.lookup(method, template) {
        RouteAccess::Declared(access) => Ok(access),
        // No route (404 to come) or not this method (405): a reader may hear that of a
        // read, a change needs a writer first, as it would on any route.
        RouteAccess::Unknown if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) => {
            Ok(Access::Role(Role::Reader))
        }
        RouteAccess::Unknown => Ok(Access::Role(Role::Writer)),
        RouteAccess::Undeclared => Err(ApiError::Internal(format!(
            "{method} {} declares no access: refused to everyone",
            template.unwrap_or(path)
        ))),
    }
}

/// A request as the auth check sees it: what it asks and who may ask it.
struct Route<'a> {
    method: &'a Method,
    path: &'a str,
    /// The matched route's template (`/v1/studies/{study}`), if any.
    template: Option<&'a str>,
    access: Access,
}

/// The token from the dashboard's cookie, as a bearer header would carry it. Only for
/// reads: a cookie rides along on cross-site requests, so it must never authorize a change.
fn cookie_token(method: &Method, headers: &axum::http::HeaderMap) -> Option<String> {
    // A WebSocket's GET runs commands (`api::exec`): a change, never the cookie's.
    if !matches!(*method, Method::GET | Method::HEAD) || super::guard::is_websocket(headers) {
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

/// The prefix of the subprotocol that carries a bearer token on a WebSocket upgrade to the
/// exec route: `base64url.bearer.augur.<the token in base64url, without padding>` (a token
/// may hold characters a subprotocol may not). The client offers it beside
/// [`super::exec::SUBPROTOCOL`], which the server selects: the token is never echoed.
pub const BEARER_SUBPROTOCOL: &str = "base64url.bearer.augur.";

/// The token a WebSocket upgrade offers as a subprotocol ([`BEARER_SUBPROTOCOL`]), if any;
/// one that is not base64url of a token (or offered twice) is refused 401.
fn subprotocol_token(headers: &axum::http::HeaderMap) -> Result<Option<String>, ApiError> {
    use base64::Engine as _;
    let mut offered = headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or_default().split(','))
        .filter_map(|p| p.trim().strip_prefix(BEARER_SUBPROTOCOL));
    let Some(encoded) = offered.next() else {
        return Ok(None);
    };
    if offered.next().is_some() {
        return Err(ApiError::Unauthenticated);
    }
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or(ApiError::Unauthenticated)?;
    Ok(Some(token))
}

/// Who an `Authorization` value (`Bearer <token>`) names: everyone is `open` on an open
/// server. Shared with Optuna's gRPC storage (`api/optuna/`), which reads the same value from
/// a call's metadata.
pub(crate) async fn bearer_caller(
    state: &AppState,
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
    state
        .service
        .authenticate(token)
        .await?
        .ok_or(ApiError::Unauthenticated)
}

async fn check(
    state: &AppState,
    route: &Route<'_>,
    authorization: Option<&str>,
) -> Result<Caller, ApiError> {
    let caller = bearer_caller(state, authorization).await?;
    if let Some(scope) = caller.trial_scope {
        let own = matches!(route.access, Access::RoleOrOwnTrial(_))
            && route
                .template
                .and_then(|t| trial_of_path(t, route.path))
                .is_some_and(|named| named == scope);
        return if own {
            Ok(caller)
        } else {
            Err(ApiError::denied(
                "this token may only report to its own trial",
            ))
        };
    }
    let needed = match route.access {
        Access::Role(role) | Access::RoleOrOwnTrial(role) => role,
        Access::Public => Role::Reader,
    };
    if caller.role < needed {
        return Err(ApiError::denied(format!(
            "{} {} needs a {needed} token; {:?} is a {}",
            route.method, route.path, caller.name, caller.role
        )));
    }
    Ok(caller)
}
