//! [`Handler`]: what a [`Worker`](super::Worker) runs for each task it claims.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use task_dedup_entity::task_run;

/// Runs one claimed task. Return `Ok(result)` (stored as the task's `result`),
/// `Err(HandlerError::Retry(..))` to run it again after the worker's backoff,
/// `Err(HandlerError::Fail(..))` to fail it for good, or
/// `Err(HandlerError::Snooze(d))` to run it again in `d` without counting the attempt.
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

/// How a handler's attempt ended, when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandlerError {
    /// Worth another attempt: the task goes back to the queue after the worker's
    /// [`RetryPolicy`](crate::RetryPolicy) backoff, or fails for good after its last
    /// attempt. The message is stored in `error`.
    Retry(String),
    /// Not worth another attempt: the task fails for good with this message.
    Fail(String),
    /// Not now: run the task again this long from now (by the database's clock), as
    /// River's `JobSnooze` and Oban's `{:snooze, seconds}` do. The task goes back to
    /// `queued` with its key still held (no duplicate can be enqueued meanwhile), the
    /// attempt is not counted (`attempts` as before the claim) and `snoozes` is. A task
    /// that already snoozed [`max_snoozes`](super::WorkerBuilder::max_snoozes) times
    /// fails for good instead, so that a handler that always snoozes cannot keep a key
    /// for ever. For a rate-limited API, a resource not ready yet, a business-hours
    /// window.
    ///
    /// ```
    /// use std::time::Duration;
    /// use task_dedup::{HandlerError, task_run};
    /// use tokio_util::sync::CancellationToken;
    ///
    /// async fn sync(task: task_run::Model, _cancel: CancellationToken)
    ///     -> Result<Option<serde_json::Value>, HandlerError>
    /// {
    ///     let upstream_ready = task.snoozes >= 2;
    ///     if !upstream_ready {
    ///         return Err(HandlerError::snooze(Duration::from_secs(30)));
    ///     }
    ///     Ok(None)
    /// }
    /// ```
    Snooze(Duration),
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

    /// [`HandlerError::Snooze`] for `delay`.
    pub fn snooze(delay: Duration) -> HandlerError {
        HandlerError::Snooze(delay)
    }

    /// The message (`"snoozed"` for a snooze).
    pub fn message(&self) -> &str {
        match self {
            HandlerError::Retry(message) | HandlerError::Fail(message) => message,
            HandlerError::Snooze(_) => "snoozed",
        }
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandlerError::Retry(message) => write!(f, "retryable: {message}"),
            HandlerError::Fail(message) => write!(f, "permanent: {message}"),
            HandlerError::Snooze(delay) => write!(f, "snoozed for {delay:?}"),
        }
    }
}

impl std::error::Error for HandlerError {}
