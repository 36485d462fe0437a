//! [`Error`]: why a page or an action was refused, and its HTTP status.

use axum::http::StatusCode;
use task_dedup::{DedupError, TaskStatus, task_run};
use uuid::Uuid;

/// Why a request did not get its page or its action. Only [`Error::Database`] is a 5xx.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A parameter is invalid (a filter, a page size, a cursor, a reason): 400.
    #[error("{0}")]
    BadRequest(String),
    /// No task has this id, or the id is malformed: 404.
    #[error("no task has the id {0}")]
    NoSuchTask(String),
    /// A path the dashboard does not have: 404.
    #[error("the dashboard has no such page")]
    NoSuchPage,
    /// A page asked for with a method it does not answer (`GET` of an action): 405.
    #[error("this page does not answer that method (actions are POST forms)")]
    MethodNotAllowed,
    /// The task is not in a state the action applies to: 409.
    #[error("cannot {action} task {id}: it is {status}")]
    WrongState {
        /// The task.
        id: Uuid,
        /// The action.
        action: task_dedup::Transition,
        /// Its status now.
        status: TaskStatus,
    },
    /// A retry refused because another task holds the key: 409.
    #[error("task {id} was not retried: task {} holds its key", .holder.id)]
    KeyHeld {
        /// The task that was to be retried.
        id: Uuid,
        /// The task holding its key.
        holder: Box<task_run::Model>,
    },
    /// The action failed the CSRF check: 403.
    #[error("CSRF check failed: {0}")]
    Csrf(&'static str),
    /// The dashboard is read-only: 403.
    #[error("the dashboard is read-only: actions are disabled")]
    ReadOnly,
    /// The database failed (or kept a key contended): 500, or 503 when trying again
    /// later may help.
    #[error("the database failed")]
    Database(DedupError),
}

impl Error {
    /// The response's status.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::NoSuchTask(_) | Error::NoSuchPage => StatusCode::NOT_FOUND,
            Error::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Error::WrongState { .. } | Error::KeyHeld { .. } => StatusCode::CONFLICT,
            Error::Csrf(_) | Error::ReadOnly => StatusCode::FORBIDDEN,
            Error::Database(
                DedupError::ConnectionLost(_)
                | DedupError::Timeout(_)
                | DedupError::Contention { .. },
            ) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<DedupError> for Error {
    fn from(err: DedupError) -> Error {
        match err {
            DedupError::InvalidArgument { .. } | DedupError::InvalidKey { .. } => {
                Error::BadRequest(err.to_string())
            }
            DedupError::NotFound { id } => Error::NoSuchTask(id.to_string()),
            DedupError::InvalidTransition {
                id,
                transition,
                status,
            } => Error::WrongState {
                id,
                action: transition,
                status,
            },
            DedupError::KeyHeld { id, holder } => Error::KeyHeld { id, holder },
            other => Error::Database(other),
        }
    }
}
