//! What the worker's parts hand each other about a task's end: how its run ended
//! ([`Ended`], from [`run`](super::run)), the ending to record ([`Ending`], from
//! [`record`](super::record) to the [`completer`](super::completer)), and what became of
//! it ([`Recorded`], counted once by [`counted`]). A leaf: the three parts import it and
//! not each other's types.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::handler::HandlerError;
use super::{Shared, add};
use crate::metrics;

/// How a task's run ended, before it is recorded.
pub(super) enum Ended {
    /// The handler returned.
    Returned(Result<Option<serde_json::Value>, HandlerError>),
    /// The handler panicked.
    Panicked(String),
    /// The task was cancelled while it ran (an operator, `TaskAdmin::cancel`): the result
    /// is discarded, the task stays cancelled.
    Cancelled,
    /// The task was taken away otherwise (reaped and claimed by another worker, deleted,
    /// finished by someone else): the result is discarded.
    Lost,
    /// The shutdown grace ran out, or the handler outlived its cancel grace and was
    /// dropped.
    Aborted,
    /// The handler ran out of its timeout (this long) and did not return success within
    /// the cancel grace.
    TimedOut(Duration),
}

/// How a task's run ended, to be recorded.
pub(super) struct Ending {
    pub id: Uuid,
    pub end: End,
    /// When the task started: its claim-to-finish time runs to the recording.
    pub started: std::time::Instant,
}

/// What an [`Ending`] records (values already validated).
pub(super) enum End {
    /// running → succeeded with the handler's result.
    Complete(Option<serde_json::Value>),
    /// running → failed for good with this error.
    Fail(String),
    /// running → queued after `delay` (`delay_micros` as bound), with this error.
    Retry {
        error: String,
        delay: Duration,
        delay_micros: i64,
    },
}

/// Whether a running task was taken away from its handler, and how: set by the heartbeat
/// or the cancel watch, read by the task once its handler ended.
#[derive(Default)]
pub(super) struct TakenAway(AtomicU8);

impl TakenAway {
    const CANCELLED: u8 = 1;
    const LOST: u8 = 2;

    /// Taken away by a cancel (the row says `cancelled`), or else lost.
    pub(super) fn set(&self, cancelled: bool) {
        let how = if cancelled {
            TakenAway::CANCELLED
        } else {
            TakenAway::LOST
        };
        self.0.store(how, Ordering::Relaxed);
    }

    /// How the task ended if it was taken away: [`Ended::Cancelled`] or [`Ended::Lost`].
    pub(super) fn ended(&self) -> Option<Ended> {
        match self.0.load(Ordering::Relaxed) {
            TakenAway::CANCELLED => Some(Ended::Cancelled),
            TakenAway::LOST => Some(Ended::Lost),
            _ => None,
        }
    }
}

/// What became of a task, once recorded.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    Completed,
    Retried,
    Failed,
    Released,
    Snoozed,
    Cancelled,
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
            Recorded::Snoozed => "snoozed",
            Recorded::Cancelled => "cancelled",
            Recorded::Lost => "lost",
        }
    }
}

/// Counts task `id`'s outcome in the report and the metrics.
pub(super) fn counted(shared: &Shared, id: Uuid, recorded: Recorded, started: Instant) {
    let counters = &shared.counters;
    add(
        match recorded {
            Recorded::Completed => &counters.completed,
            Recorded::Retried => &counters.retried,
            Recorded::Failed => &counters.failed,
            Recorded::Released => &counters.released,
            Recorded::Snoozed => &counters.snoozed,
            Recorded::Cancelled => &counters.cancelled,
            Recorded::Lost => &counters.lost,
        },
        1,
    );
    tracing::debug!(task_id = %id, outcome = recorded.name(), "task ended");
    metrics::handled(recorded.name(), started.elapsed());
}
