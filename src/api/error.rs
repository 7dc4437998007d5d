//! The API's one error type, rendered as `{"error": {"code", "message", "field"}}` in one
//! place. Internal causes are logged and never shown.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::model::ValidationError;
use crate::service::{ServiceError, error_chain};

#[derive(Debug)]
pub enum ApiError {
    /// 400: a field of the request is wrong; `field` names it.
    InvalidArgument {
        message: String,
        field: Option<String>,
    },
    /// 401: no valid bearer token.
    Unauthenticated,
    /// 403: the caller may not do this: its role is too low (`field` names what needs
    /// more, e.g. `trial_job`), the study is another's, a trial token used on another
    /// trial, or a page of another origin.
    PermissionDenied {
        message: String,
        field: Option<String>,
    },
    /// 404: no such study, trial or route.
    NotFound(String),
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 409: the study or trial is in the wrong state for this request.
    FailedPrecondition {
        message: String,
        field: Option<String>,
    },
    /// 413: the body is larger than the configured limit.
    PayloadTooLarge,
    /// 415: the body is not JSON.
    UnsupportedMediaType,
    /// 429 with `Retry-After`: the caller sent more than its rate limit allows.
    TooManyRequests { retry_after_secs: u64 },
    /// 503 with `Retry-After`: the database cannot be reached right now (it restarts, or
    /// fails over); nothing was changed, and the same request may be sent again. (A change
    /// that may have been applied is [`ApiError::Unanswered`].)
    Unavailable,
    /// 500, code `unanswered`: the database went out of reach while or just after the
    /// change was committed, or its connection broke once the change was sent; the message
    /// says which. Read the study or trial before
    /// sending the request again (it may have been applied).
    Unanswered(String),
    /// 500: logged with its cause; the client sees only that it happened.
    Internal(String),
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// invalid_argument, unauthenticated, permission_denied, not_found, method_not_allowed,
    /// failed_precondition, payload_too_large, unsupported_media_type, too_many_requests,
    /// unavailable, unanswered, internal
    pub code: String,
    pub message: String,
    /// The offending field, e.g. `parameters[2].min`.
    pub field: Option<String>,
}

impl ApiError {
    pub fn denied(message: impl Into<String>) -> Self {
        ApiError::PermissionDenied {
            message: message.into(),
            field: None,
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidArgument {
            message: message.into(),
            field: Some(field.into()),
        }
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        ApiError::InvalidArgument {
            message: e.message,
            field: Some(e.field),
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::Invalid(v) => v.into(),
            ServiceError::NotFound(what) => ApiError::NotFound(format!("{what} not found")),
            ServiceError::Conflict { message, field } => {
                ApiError::FailedPrecondition { message, field }
            }
            ServiceError::PermissionDenied { message, field } => {
                ApiError::PermissionDenied { message, field }
            }
            ServiceError::Unavailable(why) => {
                tracing::warn!(%why, "answering 503: the database is unavailable");
                ApiError::Unavailable
            }
            ServiceError::Unanswered(why) => {
                tracing::warn!(%why, "answering 500: a change's outcome could not be told");
                ApiError::Unanswered(why)
            }
            ServiceError::Store(s) => ApiError::Internal(s.to_string()),
            ServiceError::Internal(e) => ApiError::Internal(error_chain(&e)),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut retry_after = None;
        let (status, code, message, field) = match self {
            ApiError::InvalidArgument { message, field } => {
                (StatusCode::BAD_REQUEST, "invalid_argument", message, field)
            }
            ApiError::Unauthenticated => (
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "send Authorization: Bearer <token>".to_string(),
                None,
            ),
            ApiError::PermissionDenied { message, field } => {
                (StatusCode::FORBIDDEN, "permission_denied", message, field)
            }
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m, None),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method".to_string(),
                None,
            ),
            ApiError::FailedPrecondition { message, field } => {
                (StatusCode::CONFLICT, "failed_precondition", message, field)
            }
            ApiError::PayloadTooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "the request body is larger than the server accepts".to_string(),
                None,
            ),
            ApiError::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as application/json".to_string(),
                None,
            ),
            ApiError::TooManyRequests { retry_after_secs } => {
                retry_after = Some(retry_after_secs);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_requests",
                    format!(
                        "this token sent more requests than it may; retry after {retry_after_secs} s"
                    ),
                    None,
                )
            }
            ApiError::Unavailable => {
                retry_after = Some(RETRY_AFTER_OUTAGE_SECS);
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!(
                        "the database cannot be reached right now; retry after \
                         {RETRY_AFTER_OUTAGE_SECS} s"
                    ),
                    None,
                )
            }
            ApiError::Unanswered(why) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "unanswered",
                format!(
                    "{why}: read the study or trial to see whether it was, before sending \
                     the request again"
                ),
                None,
            ),
            ApiError::Internal(cause) => {
                tracing::error!(%cause, "internal error");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error".to_string(),
                    None,
                )
            }
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_string(),
                message,
                field,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// What a client is told to wait while the database is unavailable: a restart takes a
/// second or two; a client retrying sooner only adds load.
pub const RETRY_AFTER_OUTAGE_SECS: u64 = 1;
