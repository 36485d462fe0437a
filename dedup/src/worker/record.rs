//! Recording how a task's run ended: complete, retry or fail (handed to the
//! [`completer`](super::completer), which records them in batches), release, or nothing
//! for a task taken away. Kept apart from running it ([`run`](super::run)).

use std::time::Instant;

use uuid::Uuid;

use super::handler::HandlerError;
use super::outcome::{End, Ended, Ending, Recorded, counted};
use super::{Shared, add};
use crate::lifecycle::TaskLifecycle;
use crate::values::backoff::{Retry, RetryPolicy};
use crate::values::error::DedupError;
use crate::values::validate;
use task_dedup_entity::task_run;

/// A task as its claim left it, for recording its end.
pub(super) struct Claimed {
    pub id: Uuid,
    /// The attempt number of this run.
    pub attempts: i32,
    /// Its snoozes before this run.
    pub snoozes: i32,
    pub started: Instant,
}

/// Records how a `claimed` task ended: a release, a snooze or a loss at once, anything
/// else through the completer. Returns once the completer took the ending (at once,
/// unless a batch is waiting to be recorded).
pub(super) async fn record(shared: &Shared, claimed: Claimed, retry: &RetryPolicy, ended: Ended) {
    let Claimed {
        id,
        attempts,
        snoozes,
        started,
    } = claimed;
    let end = match ended {
        Ended::Returned(Ok(result)) => match validate::json("result", result.as_ref()) {
            Ok(()) => End::Complete(result),
            Err(err) => {
                let err = DedupError::from(err);
                tracing::warn!(error = %err, "the handler's result cannot be stored; its lease will run out");
                return counted(shared, id, Recorded::Lost, started);
            }
        },
        Ended::Returned(Err(HandlerError::Retry(message))) => {
            retry_or_fail(retry, attempts, truncated(message))
        }
        Ended::Returned(Err(HandlerError::Fail(message))) => End::Fail(truncated(message)),
        Ended::Returned(Err(HandlerError::Snooze(delay))) => {
            match snooze_refused(shared.config.max_snoozes, snoozes, delay) {
                Some(message) => End::Fail(message),
                None => return snooze(shared, id, delay, started).await,
            }
        }
        Ended::TimedOut(timeout) => {
            add(&shared.counters.timed_out, 1);
            crate::metrics::timed_out();
            retry_or_fail(retry, attempts, timed_out(timeout))
        }
        Ended::Panicked(message) => {
            add(&shared.counters.panicked, 1);
            tracing::error!(panic = %message, "handler panicked");
            let message = truncated(format!("handler panicked: {message}"));
            retry_or_fail(retry, attempts, message)
        }
        Ended::Cancelled => return counted(shared, id, Recorded::Cancelled, started),
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

/// A snoozed task back in the queue, due in `delay`, at once (not batched: the
/// completer's batches are for the endings that free a key).
async fn snooze(shared: &Shared, id: Uuid, delay: std::time::Duration, started: Instant) {
    let recorded = match shared.db().snooze(id, &shared.config.id, delay).await {
        Ok(task) => {
            if task.status == task_run::TaskStatus::Queued {
                shared.claim_after(delay);
            }
            Recorded::Snoozed
        }
        Err(err) => {
            tracing::warn!(error = %err, "could not snooze the task; its lease will run out");
            Recorded::Lost
        }
    };
    counted(shared, id, recorded, started);
}

/// Why a task that already snoozed `snoozes` times may not snooze for `delay`: past
/// `max_snoozes`, or a delay too long to store. `None` when it may.
pub(super) fn snooze_refused(
    max_snoozes: u32,
    snoozes: i32,
    delay: std::time::Duration,
) -> Option<String> {
    if i64::from(snoozes) >= i64::from(max_snoozes) {
        return Some(format!(
            "snoozed {snoozes} times, the most the worker allows (max_snoozes {max_snoozes}); \
             not snoozed again"
        ));
    }
    validate::micros("snooze", delay)
        .err()
        .map(|err| format!("cannot snooze for {delay:?}: {}", DedupError::from(err)))
}

/// The error of an attempt that ran out of its `timeout`.
pub(super) fn timed_out(timeout: std::time::Duration) -> String {
    format!("timed out after {timeout:?}")
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
