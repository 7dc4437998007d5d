//! Vertex's error body, `{"error": {"code", "message", "status"}}`, in one place: every error
//! answer on a Vizier path (a handler's, or auth's, a limit's, a timeout's from the layers
//! outside) leaves as Augur's and is rewritten here, with Google's HTTP code for its status.

use axum::Json;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value as JsonValue, json};

use crate::api::error::ApiError;
use crate::model::ValidationError;
use crate::service::ServiceError;

/// A Vizier handler's error: Augur's, or what Vizier has and Augur's API does not.
#[derive(Debug)]
pub enum VizierError {
    /// 409 `ALREADY_EXISTS`: a study of that display name exists at that project and location.
    AlreadyExists(String),
    /// Augur's error, rendered by [`vertex_error_bodies`] as the table in `vertex_status`.
    Api(ApiError),
}

pub type VizierResult<T> = Result<T, VizierError>;

impl From<ApiError> for VizierError {
    fn from(e: ApiError) -> Self {
        VizierError::Api(e)
    }
}

impl From<ServiceError> for VizierError {
    fn from(e: ServiceError) -> Self {
        VizierError::Api(e.into())
    }
}

impl From<ValidationError> for VizierError {
    fn from(e: ValidationError) -> Self {
        VizierError::Api(e.into())
    }
}

impl IntoResponse for VizierError {
    fn into_response(self) -> Response {
        match self {
            VizierError::AlreadyExists(message) => {
                vertex_body(StatusCode::CONFLICT, "ALREADY_EXISTS", &message, None)
            }
            VizierError::Api(e) => e.into_response(),
        }
    }
}

/// Whether a path is one of Vizier's (`/v1/projects/…`, `/v1beta1/projects/…`, and the
/// operations under `/ui/projects/…`).
pub fn is_vizier_path(path: &str) -> bool {
    ["/v1/projects/", "/v1beta1/projects/", "/ui/projects/"]
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

/// Augur's error code as Google's canonical status and the HTTP code Google gives it
/// (`google.rpc.Code`): a state conflict is FAILED_PRECONDITION, 400 as Vertex answers it.
fn vertex_status(code: &str, http: StatusCode) -> (StatusCode, &'static str) {
    match code {
        "invalid_argument" | "payload_too_large" | "unsupported_media_type" => {
            (http, "INVALID_ARGUMENT")
        }
        "unauthenticated" => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        "permission_denied" => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        "not_found" => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        "method_not_allowed" => (http, "UNIMPLEMENTED"),
        "failed_precondition" => (StatusCode::BAD_REQUEST, "FAILED_PRECONDITION"),
        "too_many_requests" => (http, "RESOURCE_EXHAUSTED"),
        "unavailable" => (http, "UNAVAILABLE"),
        "unanswered" => (http, "UNKNOWN"),
        _ => match http {
            StatusCode::GATEWAY_TIMEOUT => (http, "DEADLINE_EXCEEDED"),
            _ => (http, "INTERNAL"),
        },
    }
}

fn vertex_body(status: StatusCode, name: &str, message: &str, field: Option<&str>) -> Response {
    let mut error = json!({"code": status.as_u16(), "message": message, "status": name});
    if let Some(field) = field {
        // google.rpc.BadRequest: clients that read details find the field there too.
        error["details"] = json!([{
            "@type": "type.googleapis.com/google.rpc.BadRequest",
            "fieldViolations": [{"field": field, "description": message}],
        }]);
    }
    (status, Json(json!({ "error": error }))).into_response()
}

/// Rewrite an error answer on a Vizier path in Vertex's body. Augur's bodies are small; any
/// other body (a timeout's, empty) is replaced by one for its status.
pub async fn vertex_error_bodies(request: Request, next: Next) -> Response {
    if !is_vizier_path(request.uri().path()) {
        return next.run(request).await;
    }
    let response = next.run(request).await;
    let http = response.status();
    if !(http.is_client_error() || http.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let doc: JsonValue = serde_json::from_slice(&bytes).unwrap_or(JsonValue::Null);
    let error = &doc["error"];
    if error["code"].is_number() {
        // Already Vertex's (ALREADY_EXISTS).
        return Response::from_parts(parts, Body::from(bytes));
    }
    let code = error["code"].as_str().unwrap_or("");
    let field = error["field"].as_str();
    let text = error["message"].as_str().unwrap_or_else(|| {
        http.canonical_reason()
            .unwrap_or("the request could not be answered")
    });
    // The field leads the message: the SDK shows only the message.
    let message = match field {
        Some(f) if !text.starts_with(f) => format!("{f}: {text}"),
        _ => text.to_string(),
    };
    let (status, name) = vertex_status(code, http);
    let rendered = vertex_body(status, name, &message, field);
    parts.status = status;
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, rendered.into_body())
}
