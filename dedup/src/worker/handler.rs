//! [`Handler`]: what a [`Worker`](super::Worker) runs for each task it claims.

use std::fmt;
use std::future::Future;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use task_dedup_entity::task_run;

/// Runs one claimed task. Return `Ok(result)` (stored as the task's `result`),
/// `Err(HandlerError::Retry(..))` to run it again after the worker's backoff, or
/// `Err(HandlerError::Fail(..))` to fail it for good.
///
/// `cancel` fires when the task was taken away while it ran (cancelled, or its lease
/// lost to the reaper) or the worker's shutdown grace ran out: stop soon; what is
/// returned then is discarded (on shutdown, a success still counts). A handler still
/// running after the worker's
/// [`cancel_grace`](super::WorkerBuilder::cancel_grace) is dropped at its next
/// `.await`. A handler that panics fails its attempt (retried like
/// `Retry`) and does not take the worker down.
///
/// Any `async` closure or function of this shape is a handler:
///
/// ```
/// use task_dedup::{Handler, HandlerError};
/// use task_dedup::task_run;
/// use tokio_util::sync::CancellationToken;
///
/// async fn render(task: task_run::Model, cancel: CancellationToken)
///     -> Result<Option<serde_json::Value>, HandlerError>
/// {
///     tokio::select! {
///         () = cancel.cancelled() => Err(HandlerError::retry("interrupted")),
///         () = tokio::time::sleep(std::time::Duration::from_millis(1)) => {
///             Ok(Some(serde_json::json!({"rendered": task.resource_key})))
///         }
///     }
/// }
/// fn takes(_: impl Handler) {}
/// takes(render);
/// ```
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Runs `task` (as claimed: `status` running, `attempts` counting this one).
    async fn handle(
        &self,
        task: task_run::Model,
        cancel: CancellationToken,
    ) -> Result<Option<serde_json::Value>, HandlerError>;
}

#[async_trait]
impl<F, Fut> Handler for F
where
    F: Fn(task_run::Model, CancellationToken) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Option<serde_json::Value>, HandlerError>> + Send + 'static,
{
    async fn handle(
        &self,
        task: task_run::Model,
        cancel: CancellationToken,
    ) -> Result<Option<serde_json::Value>, HandlerError> {
        self(task, cancel).await
    }
}

/// How a handler's attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerError {
    /// Worth another attempt: the task goes back to the queue after the worker's
    /// [`RetryPolicy`](crate::RetryPolicy) backoff, or fails for good after its last
    /// attempt. The message is stored in `error`.
    Retry(String),
    /// Not worth another attempt: the task fails for good with this message.
    Fail(String),
}

impl HandlerError {
    /// [`HandlerError::Retry`] with `message`.
    pub fn retry(message: impl fmt::Display) -> HandlerError {
        HandlerError::Retry(message.to_string())
    }

    /// [`HandlerError::Fail`] with `message`.
    pub fn fail(message: impl fmt::Display) -> HandlerError {
        HandlerError::Fail(message.to_string())
    }

    /// The message.
    pub fn message(&self) -> &str {
        match self {
            HandlerError::Retry(message) | HandlerError::Fail(message) => message,
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retry(message) => write!(f, "retryable: {message}"),
            HandlerError::Fail(message) => write!(f, "permanent: {message}"),
        }
    }
}

impl std::error::Error for HandlerError {}
