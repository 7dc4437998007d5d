//! HTTP: axum routers and thin handlers over the service. The router *is* the OpenAPI spec:
//! every route is registered through `utoipa_axum::routes!`, and `openapi.yaml` at the top
//! of the repository is its committed snapshot (a test keeps them equal). `app.rs` puts the
//! API's routes and the dashboard's together and wraps them in [`serve_layers`].

pub mod access;
pub mod auth;
mod charts;
pub mod error;
pub mod exec;
mod extract;
pub mod forward;
mod guard;
mod health;
mod notifications;
pub mod optuna;
mod pools;
pub mod rate_limit;
mod studies;
mod tokens;
mod trials;
pub mod vizier;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_http::timeout::TimeoutLayer;
use utoipa::OpenApi;

use access::AccessRouter;
pub use studies::{StudyList, SuggestRequest, SuggestResponse};
pub use trials::{CompleteRequest, MeasurementRequest, TrialList};

use crate::service::Service;
use error::ApiError;

/// What every handler (the API's and the dashboard's) gets.
#[derive(Clone)]
pub struct AppState {
    pub service: Service,
    pub auth: auth::Auth,
    pub metrics: PrometheusHandle,
    pub openapi_yaml: Arc<str>,
    /// The URL jobs and browsers reach this server at (`--public-url`): its origin is this
    /// server's own, besides the one a request names in `Host`.
    pub public_url: Arc<str>,
    /// The per-token rate limit (`--rate-limit`; none by default).
    pub limits: rate_limit::RateLimit,
    /// The limit on failed token checks per source address (always on).
    pub failures: rate_limit::FailureLimit,
    /// This server speaks HTTPS itself (`--tls-cert`): its answers carry HSTS.
    pub tls: bool,
    /// Where a study's changes go when several replicas share the database
    /// (`--replica-url`); `None`: every request is served here.
    pub forwarder: Option<forward::Forwarder>,
    /// Who may call each route (`access`), read by the auth layer.
    pub access: Arc<access::AccessTable>,
}

impl AppState {
    pub fn new(service: Service, open: bool, public_url: String, openapi_yaml: String) -> Self {
        AppState {
            service,
            auth: auth::Auth::new(open),
            metrics: metrics_handle(),
            openapi_yaml: openapi_yaml.into(),
            public_url: public_url.into(),
            limits: rate_limit::RateLimit::default(),
            failures: rate_limit::FailureLimit::default(),
            tls: false,
            forwarder: None,
            access: Arc::default(),
        }
    }

    /// The same state, with the routes' declared access.
    pub fn with_access(mut self, access: access::AccessTable) -> Self {
        self.access = Arc::new(access);
        self
    }

    /// The same state, sending each study's changes to the replica that takes them.
    pub fn with_forwarder(mut self, forwarder: Option<forward::Forwarder>) -> Self {
        self.forwarder = forwarder;
        self
    }

    /// The same state, for a server that speaks HTTPS itself.
    pub fn with_tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Whether browsers reach this server over HTTPS (its own TLS, or a proxy's named by
    /// `--public-url`): then the login cookie is `Secure`, never sent over plain HTTP.
    pub fn https(&self) -> bool {
        self.tls || self.public_url.starts_with("https://")
    }

    /// The same state, limiting each token to `per_second` requests a second.
    pub fn with_rate_limit(mut self, per_second: Option<f64>) -> Self {
        self.limits = rate_limit::RateLimit::new(per_second);
        self
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Augur",
        description = "Self-hosted hyperparameter tuning: studies, trials, suggestions (ask/tell), measurements.\n\nTokens carry a role: reader (every GET), writer (also create studies; on its own studies, ask/tell: suggest, add trials, report, and change, stop, delete them), operator (also studies with a trial_job), admin (also tokens, the audit trail, every study); a trial token reads and reports to its own trial only. Any route may also answer 429 with Retry-After (a token past its rate limit, when one is configured, or an address that sent too many unknown tokens: after 10, one try every 6 s) and 503 with Retry-After and code `unavailable` (the database cannot be reached right now): nothing was done, send the same request again after the wait. A change caught by such an outage during or just after its commit (or sent when the database connection broke), or lost by the replica it was forwarded to, is answered 500 with code `unanswered` instead (it may have been applied): read the study or trial before sending it again. Replicas started with `--replica-url` may forward a change of a busy study (any method but GET under `/v1/studies/{study}`) to the replica that owns it; an answer to a change of a study another replica owns, forwarded or not, names that replica's base URL in the `augur-study-replica` header, and a client may send the study's next changes there directly (the URL is one the replica already sends the caller's token to; a client of an https URL should not follow an http one, nor a client of another host a loopback one).",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    // Recursive schemas are referenced, not inlined: they must be listed here.
    components(schemas(
        crate::model::spec::ChildInput,
        crate::model::spec::ParameterInput,
        exec::ExecStart,
        exec::ExecControl
    )),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    tags(
        (name = "studies", description = "Create and manage studies"),
        (name = "trials", description = "Suggest, report and inspect trials"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
        (name = "dashboard", description = "The web dashboard's pages and the chart data they draw"),
        (name = "tokens", description = "Tokens with roles and the audit trail (an admin's)"),
        (name = "pools", description = "Worker pools shared by studies: workers, queues, utilisation, leases"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API's routes with their OpenAPI document, each declaring who may call it.
pub fn routes() -> AccessRouter {
    AccessRouter::with_openapi(ApiDoc::openapi())
        .merge(studies::router())
        .merge(notifications::router())
        .merge(pools::router())
        .merge(trials::router())
        .merge(exec::router())
        .merge(health::router())
        .merge(charts::router())
        .merge(tokens::router())
        .merge(vizier::router())
}

/// The Prometheus recorder is process-wide; every app in the process shares it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed");
            }
            handle
        })
        .clone()
}

/// Wrap every route (the API's and the dashboard's) in what each request goes through:
/// metrics, the browser guard, auth, the body limit, a timeout and HSTS; unknown routes and
/// methods answer with the API's JSON errors.
pub fn serve_layers(router: Router<AppState>, state: AppState, body_limit: usize) -> Router {
    router
        .route_layer(middleware::from_fn(record_request))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside auth: a request is checked where it arrived before it is sent on.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            forward::to_study_owner,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        // Outside auth: a foreign page's request is refused before any token is looked at.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::refuse_foreign_requests,
        ))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::GATEWAY_TIMEOUT,
            Duration::from_secs(60),
        ))
        // Vizier's paths answer errors in Vertex's body, whichever layer refused them.
        .layer(middleware::from_fn(vizier::vertex_error_bodies))
        // Outermost: every answer of a TLS server, refusals and timeouts too.
        .layer(middleware::from_fn_with_state(
            state.clone(),
            strict_transport_security,
        ))
        .with_state(state)
}

/// How long a browser that saw this server over HTTPS keeps to HTTPS for it: a year, as
/// browsers' preload lists ask. Sent only by a server that speaks TLS itself (over plain
/// HTTP browsers ignore it; behind a TLS proxy, the proxy sets its own).
const HSTS: &str = "max-age=31536000";

async fn strict_transport_security(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = next.run(request).await;
    if state.tls {
        response.headers_mut().insert(
            axum::http::header::STRICT_TRANSPORT_SECURITY,
            axum::http::HeaderValue::from_static(HSTS),
        );
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Count and time every request by method, matched route and status.
async fn record_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("augur_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("augur_http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}
