//! Recording how a task's run ended: complete, retry or fail (handed to the
//! [`completer`](super::completer), which records them in batches), release, or nothing
//! for a task taken away. Kept apart from running it ([`execute`](super::execute)).

use std::time::Instant;

use uuid::Uuid;

use super::handler::HandlerError;
use super::outcome::{End, Ended, Ending, Recorded, counted};
use super::{Shared, add};
use crate::lifecycle::TaskWorker;
use crate::values::backoff::{Retry, RetryPolicy};
use crate::values::validate;
use task_dedup_entity::task_run;

/// Records how task `id` (claimed for attempt number `attempts`, started at `started`)
/// ended: a release or a loss at once, anything else through the completer. Returns once
/// the completer took the ending (at once, unless a batch is waiting to be recorded).
pub(super) async fn record(
    shared: &Shared,
    id: Uuid,
    attempts: i32,
    retry: &RetryPolicy,
    ended: Ended,
    started: Instant,
) {
    let end = match ended {
        Ended::Returned(Ok(result)) => match validate::json("result", result.as_ref()) {
            Ok(()) => End::Complete(result),
            Err(err) => {
                let err = crate::values::error::DedupError::from(err);
                tracing::warn!(error = %err, "the handler's result cannot be stored; its lease will run out");
                return counted(shared, id, Recorded::Lost, started);
            }
        },
        Ended::Returned(Err(HandlerError::Retry(message))) => {
            retry_or_fail(retry, attempts, truncated(message))
        }
        Ended::Returned(Err(HandlerError::Fail(message))) => End::Fail(truncated(message)),
        Ended::Panicked(message) => {
            add(&shared.counters.panicked, 1);
            tracing::error!(panic = %message, "handler panicked");
            let message = truncated(format!("handler panicked: {message}"));
            retry_or_fail(retry, attempts, message)
        }
        Ended::Lost => return counted(shared, id, Recorded::Lost, started),
        Ended::Aborted => {
            let recorded = match shared.db().release(id, &shared.config.id).await {
                Ok(_) => Recorded::Released,
                Err(err) => {
                    tracing::warn!(error = %err, "could not release the task; its lease will run out");
                    Recorded::Lost
                }
            };
            return counted(shared, id, recorded, started);
        }
    };
    let ending = Ending { id, end, started };
    if let Err(unsent) = shared.endings.send(ending).await {
        // The completer is gone with its worker.
        tracing::warn!(
            "the worker stopped before the task's end was recorded; its lease will run out"
        );
        counted(shared, id, Recorded::Lost, unsent.0.started);
    }
}

/// A failed attempt: back to the queue after the backoff of `retry` (the task type's,
/// else the worker's), or failed for good
/// after its last attempt. (A delay too long to store fails it for good.)
fn retry_or_fail(retry: &RetryPolicy, attempts: i32, message: String) -> End {
    match retry.after_attempt(attempts) {
        Retry::Never => End::Fail(message),
        Retry::After(delay) => match validate::micros("retry", delay) {
            Ok(delay_micros) => End::Retry {
                error: message,
                delay,
                delay_micros,
            },
            Err(_) => End::Fail(message),
        },
    }
}

/// `message`, cut to what the `error` column holds.
pub(super) fn truncated(message: String) -> String {
    let limit = task_run::ERROR_MAX_CHARS;
    let clean = message.replace('\0', "\u{fffd}");
    if clean.chars().count() <= limit {
        clean
    } else {
        clean.chars().take(limit).collect()
    }
}
