//! One error type for Optuna's gRPC storage, and its gRPC status in one place. The codes are
//! those Optuna's `GrpcStorageProxy` turns into its own exceptions: `NOT_FOUND` → `KeyError`,
//! `ALREADY_EXISTS` → `DuplicatedStudyError`, `FAILED_PRECONDITION` →
//! `UpdateFinishedTrialError`, `INVALID_ARGUMENT` → `ValueError`.

use tonic::{Code, Status};

use crate::api::error::ApiError;
use crate::service::ServiceError;

#[derive(Debug)]
pub enum OptunaError {
    /// `ALREADY_EXISTS`: an Optuna study of that name exists.
    AlreadyExists(String),
    /// Augur's error (auth's, the service's), as [`status`] maps it.
    Api(ApiError),
}

pub type OptunaResult<T> = Result<T, OptunaError>;

impl OptunaError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        OptunaError::Api(ApiError::InvalidArgument {
            message: message.into(),
            field: Some(field.to_string()),
        })
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        OptunaError::Api(ApiError::NotFound(what.into()))
    }
}

impl From<ApiError> for OptunaError {
    fn from(e: ApiError) -> Self {
        OptunaError::Api(e)
    }
}

impl From<ServiceError> for OptunaError {
    fn from(e: ServiceError) -> Self {
        // Through ApiError: it logs what must be logged (outages) the same way.
        OptunaError::Api(e.into())
    }
}

impl From<OptunaError> for Status {
    fn from(e: OptunaError) -> Self {
        status(e)
    }
}

/// The gRPC status of an error: internal causes are logged, never sent.
pub fn status(e: OptunaError) -> Status {
    let api = match e {
        OptunaError::AlreadyExists(message) => return Status::already_exists(message),
        OptunaError::Api(api) => api,
    };
    let (code, message) = match api {
        ApiError::InvalidArgument { message, field } => (
            Code::InvalidArgument,
            match field {
                Some(f) if !message.starts_with(&f) => format!("{f}: {message}"),
                _ => message,
            },
        ),
        ApiError::Unauthenticated => (
            Code::Unauthenticated,
            "a valid bearer token is needed (metadata `authorization: Bearer <token>`)".into(),
        ),
        ApiError::PermissionDenied { message, .. } => (Code::PermissionDenied, message),
        ApiError::NotFound(message) => (Code::NotFound, message),
        ApiError::MethodNotAllowed => (Code::Unimplemented, "not served".into()),
        ApiError::FailedPrecondition { message, .. } => (Code::FailedPrecondition, message),
        ApiError::PayloadTooLarge | ApiError::UnsupportedMediaType => {
            (Code::InvalidArgument, "the request is not accepted".into())
        }
        ApiError::TooManyRequests { retry_after_secs } => (
            Code::ResourceExhausted,
            format!("too many requests; retry in {retry_after_secs} s"),
        ),
        ApiError::Unavailable => (
            Code::Unavailable,
            "the database cannot be reached right now; nothing was done".into(),
        ),
        ApiError::Unanswered(why) => (Code::Unknown, why),
        ApiError::Internal(cause) => {
            tracing::error!(%cause, "optuna grpc: internal error");
            (Code::Internal, "internal error".into())
        }
    };
    Status::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_are_those_optunas_client_turns_into_its_exceptions() {
        let code = |e: OptunaError| status(e).code();
        assert_eq!(
            code(OptunaError::AlreadyExists("s".into())),
            Code::AlreadyExists
        );
        assert_eq!(
            code(ServiceError::NotFound("study 3".into()).into()),
            Code::NotFound
        );
        assert_eq!(
            code(ServiceError::conflict("trial 2 is already completed").into()),
            Code::FailedPrecondition
        );
        assert_eq!(
            code(OptunaError::invalid("values", "x")),
            Code::InvalidArgument
        );
        assert_eq!(
            code(ApiError::Unauthenticated.into()),
            Code::Unauthenticated
        );
    }
}
