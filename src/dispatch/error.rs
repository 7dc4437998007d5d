//! Dispatch's one error type: what can keep a trial from running or its outcome from being
//! recorded. The trial runner logs these and, where they end a trial, fails it with the
//! message as its reason.

use super::executor::ExecutorError;
use crate::service::ServiceError;

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The service refused or could not take a report (in-process dispatch).
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// The server refused or could not take a report (`augur worker`, over HTTP).
    #[error("{0}")]
    Remote(String),
    /// The trial's directories could not be made.
    #[error("cannot prepare the trial's directories: {0}")]
    Directories(#[source] std::io::Error),
    /// The job could not be started (or its executor cannot run it).
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// The study's `metric_regex` does not compile (validation should have refused it).
    #[error("metric_regex: {0}")]
    MetricRegex(#[from] regex::Error),
    /// A background task of the trial was lost.
    #[error("internal error: {0}")]
    Task(String),
}

pub type DispatchResult<T> = Result<T, DispatchError>;
