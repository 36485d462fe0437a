//! Recording how a task's run ended: complete, retry or fail, release, or nothing for a
//! task taken away. Kept apart from running it ([`execute`](super::execute)): the end of
//! a task is the worker's one write per task.

use std::cmp::Reverse;
use std::time::Instant;

use uuid::Uuid;

use super::execute::Ended;
use super::handler::HandlerError;
use super::{Shared, add};
use crate::TaskStatus;
use crate::backoff::Retry;
use crate::error::DedupError;
use crate::lifecycle::{self, TaskWorker};
use crate::task_run;

/// What became of a task, once recorded.
#[derive(Clone, Copy)]
enum Recorded {
    Completed,
    Retried,
    Failed,
    Released,
    Lost,
}

impl Recorded {
    /// The outcome's name, for metrics and traces.
    fn name(self) -> &'static str {
        match self {
            Recorded::Completed => "completed",
            Recorded::Retried => "retried",
            Recorded::Failed => "failed",
            Recorded::Released => "released",
            Recorded::Lost => "lost",
        }
    }
}

/// Records how task `id` (claimed for attempt number `attempts`) ended; returns the
/// outcome's name for metrics, `lost` when the end could not be recorded.
pub(super) async fn record(
    shared: &Shared,
    id: Uuid,
    attempts: i32,
    ended: Ended,
) -> (&'static str, Result<(), DedupError>) {
    let (db, worker_id) = (shared.db(), shared.config.id.as_str());
    let recorded = match ended {
        Ended::Returned(Ok(result)) => lifecycle::complete_quietly(&db, id, worker_id, result)
            .await
            .map(|()| Recorded::Completed),
        Ended::Returned(Err(HandlerError::Retry(message))) => {
            retry_or_fail(shared, id, attempts, truncated(message)).await
        }
        Ended::Returned(Err(HandlerError::Fail(message))) => db
            .fail(id, worker_id, &truncated(message), Retry::Never)
            .await
            .map(|_| Recorded::Failed),
        Ended::Panicked(message) => {
            add(&shared.counters.panicked, 1);
            tracing::error!(panic = %message, "handler panicked");
            let message = truncated(format!("handler panicked: {message}"));
            retry_or_fail(shared, id, attempts, message).await
        }
        Ended::Lost => Ok(Recorded::Lost),
        Ended::Aborted => db.release(id, worker_id).await.map(|_| Recorded::Released),
    };
    match recorded {
        Ok(recorded) => {
            let counters = &shared.counters;
            add(
                match recorded {
                    Recorded::Completed => &counters.completed,
                    Recorded::Retried => &counters.retried,
                    Recorded::Failed => &counters.failed,
                    Recorded::Released => &counters.released,
                    Recorded::Lost => &counters.lost,
                },
                1,
            );
            (recorded.name(), Ok(()))
        }
        Err(err) => (Recorded::Lost.name(), Err(err)),
    }
}

/// A failed attempt: back to the queue after the worker's backoff, or failed for good
/// after its last attempt. A retry this worker scheduled is claimed when it falls due,
/// whatever the poll interval.
async fn retry_or_fail(
    shared: &Shared,
    id: Uuid,
    attempts: i32,
    message: String,
) -> Result<Recorded, DedupError> {
    let retry = shared.config.retry.after_attempt(attempts);
    let task = shared
        .db()
        .fail(id, &shared.config.id, &message, retry)
        .await?;
    if task.status != TaskStatus::Queued {
        return Ok(Recorded::Failed);
    }
    if let Retry::After(delay) = retry
        && !delay.is_zero()
    {
        // The database's clock set `run_at` before `fail` returned, so this is no
        // earlier than the task falls due.
        shared
            .retries_due
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Reverse(Instant::now() + delay));
        shared.retry_scheduled.notify_waiters();
    }
    Ok(Recorded::Retried)
}

/// `message`, cut to what the `error` column holds.
fn truncated(message: String) -> String {
    let limit = task_run::ERROR_MAX_CHARS;
    let clean = message.replace('\0', "\u{fffd}");
    if clean.chars().count() <= limit {
        clean
    } else {
        clean.chars().take(limit).collect()
    }
}
