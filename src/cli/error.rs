//! The CLI's one error type: each variant a way a command fails, printed as one line for
//! the user by `main.rs`.

use std::path::PathBuf;

use crate::app::AppError;
use crate::dispatch::DispatchError;
use crate::service::ServiceError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server answered with an API error (`{"error": {"code", "message", "field"}}`).
    #[error("{status}{}: {message}", field.as_ref().map(|f| format!(" ({f})")).unwrap_or_default())]
    Api {
        status: u16,
        code: String,
        message: String,
        field: Option<String>,
    },
    /// The server could not be reached, or its answer not read.
    #[error("{0}")]
    Connection(String),
    /// The server's certificate was refused (not trusted, or not for that name): trying again
    /// does not help, unlike a `Connection` error.
    #[error("{0}")]
    Untrusted(String),
    /// A file given on the command line could not be read or parsed.
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    /// A command-line value is wrong.
    #[error("{0}")]
    Usage(String),
    /// `augur run`'s study ended failed (the reason the service gave).
    #[error("{0}")]
    StudyFailed(String),
    #[error(transparent)]
    App(#[from] AppError),
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
}

impl CliError {
    pub fn file(path: &std::path::Path, message: impl std::fmt::Display) -> Self {
        CliError::File {
            path: path.to_path_buf(),
            message: message.to_string(),
        }
    }

    /// Whether this is the API's answer with this status (e.g. 404, 409).
    pub fn is_status(&self, wanted: u16) -> bool {
        matches!(self, CliError::Api { status, .. } if *status == wanted)
    }
}

pub type CliResult<T> = Result<T, CliError>;
