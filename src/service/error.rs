//! The service layer's one error type. The API maps each variant to an HTTP status in
//! `api/error.rs`.

use crate::model::{ExtensionError, ValidationError};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// A field of the request is wrong (400).
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// No such study or trial (404).
    #[error("{0} not found")]
    NotFound(String),
    /// The request is well-formed but the study or trial is in the wrong state for it (409).
    #[error("{message}")]
    Conflict {
        message: String,
        field: Option<String>,
    },
    /// The caller's role or ownership does not allow this (403); `field` names the part of
    /// the request that needs more (e.g. `trial_job`).
    #[error("{message}")]
    PermissionDenied {
        message: String,
        field: Option<String>,
    },
    /// The database cannot be reached right now (503 with `Retry-After`): the same request
    /// may succeed in a moment.
    #[error("{0}")]
    Unavailable(String),
    /// A change the caller cannot be told the outcome of (500, code `unanswered`): the
    /// database went out of reach during its commit (whether it was applied is unknown) or
    /// just after it (it was applied; its answer could not be read). Not 503, which tells
    /// a client that sending the request again is safe: here it may apply it twice.
    #[error("{0}")]
    Unanswered(String),
    /// Storage failed (500; the cause is logged, not shown).
    #[error(transparent)]
    Store(StoreError),
    /// A bug, a record that cannot be read back, or a lost background task (500).
    #[error("internal error")]
    Internal(#[from] InternalError),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong inside the service (500): logged with its sources, never shown.
#[derive(Debug, thiserror::Error)]
pub enum InternalError {
    /// A background task (a blocking read, a designer) panicked or was cancelled.
    #[error("the {0} task")]
    Task(&'static str, #[source] tokio::task::JoinError),
    /// A structure shared between tasks is poisoned or closed (a task panicked).
    #[error("{0} is poisoned or closed")]
    Broken(&'static str),
    /// A file the service made cannot be read.
    #[error("{}", .path.display())]
    File {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A record the service stored cannot be read back, or one it makes cannot be written.
    #[error("{what}")]
    Data {
        what: String,
        #[source]
        source: Option<BoxError>,
    },
    /// The batch this command was committed in failed (its error, for every command).
    #[error("its batch failed: {0}")]
    Batch(String),
    /// What cannot happen unless the code is wrong.
    #[error("{0}")]
    Bug(String),
}

impl InternalError {
    /// A record that cannot be read back or written, because of `source`.
    pub fn data(what: impl Into<String>, source: impl Into<BoxError>) -> Self {
        InternalError::Data {
            what: what.into(),
            source: Some(source.into()),
        }
    }

    pub fn bug(what: impl Into<String>) -> Self {
        InternalError::Bug(what.into())
    }
}

/// `error` and its sources, as one line (`a: b: c`), for the log.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl ServiceError {
    pub fn conflict(message: impl Into<String>) -> Self {
        ServiceError::Conflict {
            message: message.into(),
            field: None,
        }
    }

    pub fn denied(message: impl Into<String>) -> Self {
        ServiceError::PermissionDenied {
            message: message.into(),
            field: None,
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ServiceError::Invalid(ValidationError::new(field, message))
    }
}

impl ServiceError {
    /// This error, met while reading the answer to a change that is already committed:
    /// an outage here must not say "nothing was done".
    pub fn after_commit(self) -> Self {
        match self {
            ServiceError::Unavailable(why) => ServiceError::Unanswered(format!(
                "the change was applied, but its answer could not be read ({why})"
            )),
            other => other,
        }
    }

    /// This error, met while committing a change: the commit may have reached the disk.
    pub fn during_commit(self) -> Self {
        match self {
            ServiceError::Unavailable(why) => ServiceError::Unanswered(format!(
                "the database went out of reach during the commit ({why}); whether the \
                 change was applied is unknown"
            )),
            other => other,
        }
    }
}

impl From<ExtensionError> for ServiceError {
    fn from(e: ExtensionError) -> Self {
        match e {
            ExtensionError::Invalid(v) => ServiceError::Invalid(v),
            ExtensionError::Conflict { field, message } => ServiceError::Conflict {
                message,
                field: Some(field),
            },
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(why) => ServiceError::Unavailable(why),
            StoreError::Lost(why) => ServiceError::Unanswered(format!(
                "the database connection broke after the change was sent ({why}); whether \
                 it was applied is unknown"
            )),
            other => ServiceError::Store(other),
        }
    }
}

pub type ServiceResult<T> = Result<T, ServiceError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_once_a_change_may_be_committed_is_unanswered_not_unavailable() {
        let outage = || ServiceError::Unavailable("connection reset".into());
        let ServiceError::Unanswered(after) = outage().after_commit() else {
            panic!("after the commit: still unavailable");
        };
        assert!(after.contains("was applied") && after.contains("connection reset"));
        let ServiceError::Unanswered(during) = outage().during_commit() else {
            panic!("during the commit: still unavailable");
        };
        assert!(during.contains("unknown") && during.contains("connection reset"));
        // Other errors say what they said.
        assert!(matches!(
            ServiceError::NotFound("trial 3".into()).after_commit(),
            ServiceError::NotFound(_)
        ));
        assert!(matches!(
            ServiceError::conflict("finished").during_commit(),
            ServiceError::Conflict { .. }
        ));
    }

    #[test]
    fn a_change_whose_connection_broke_after_sending_is_unanswered() {
        let broke = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "relay closed");
        let lost = StoreError::after_sending(sqlx::Error::Io(broke));
        let ServiceError::Unanswered(message) = ServiceError::from(lost) else {
            panic!("a change lost in flight answered as if nothing was done");
        };
        assert!(message.contains("unknown") && message.contains("relay closed"));
        // No connection to send it on: nothing was done, and 503 says so.
        let unsent = StoreError::after_sending(sqlx::Error::PoolTimedOut);
        assert!(matches!(
            ServiceError::from(unsent),
            ServiceError::Unavailable(_)
        ));
    }

    #[test]
    fn an_internal_error_is_logged_with_its_sources() {
        let error = ServiceError::from(InternalError::File {
            path: "/runs/7/job.log".into(),
            source: std::io::Error::other("disk on fire"),
        });
        assert_eq!(
            error_chain(&error),
            "internal error: /runs/7/job.log: disk on fire"
        );
    }
}
