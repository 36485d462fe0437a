//! The compare-and-set transitions of one task (heartbeat, complete, fail, cancel,
//! release): each a guarded statement, a refusal explained from the row, a change that
//! could take a held key run in a savepoint, attempts through the one retry driver.

use std::time::Duration;

use uuid::Uuid;

use crate::connect::retry::Retrying;
use crate::executor::{Change, Executor};
use crate::values::backoff::Retry;
use crate::values::connection::DedupConnection;
use crate::values::error::{DedupError, Transition};
use crate::values::validate;
use task_dedup_entity::TaskStatus;
use task_dedup_entity::task_run;

/// Who may perform a transition, and what its effect looks like once it took effect.
#[derive(Clone, Copy)]
pub(super) enum Guard<'a> {
    /// The task is running under this worker's lease; afterwards it is in one of the
    /// `done` states with this worker recorded as `lease_owner`.
    LeaseHolder {
        worker_id: &'a str,
        done: &'static [TaskStatus],
    },
    /// The task is queued or running; afterwards it is `cancelled`.
    Active,
}

/// [`TaskLifecycle::heartbeat`](super::TaskLifecycle::heartbeat).
pub(super) async fn heartbeat<C: DedupConnection>(
    db: &C,
    id: Uuid,
    worker_id: &str,
    lease: Duration,
) -> Result<task_run::Model, DedupError> {
    validate::worker_id(worker_id)?;
    let lease_micros = validate::lease_micros(lease)?;
    let guard = Guard::LeaseHolder {
        worker_id,
        done: &[TaskStatus::Running],
    };
    let change = Change::Heartbeat {
        lease_micros,
        worker_id,
    };
    retried(db, id, Op::Plain(Transition::Heartbeat, guard, change)).await
}

/// [`TaskLifecycle::complete`](super::TaskLifecycle::complete).
pub(super) async fn complete<C: DedupConnection>(
    db: &C,
    id: Uuid,
    worker_id: &str,
    result: Option<serde_json::Value>,
) -> Result<task_run::Model, DedupError> {
    validate::worker_id(worker_id)?;
    validate::json("result", result.as_ref())?;
    let guard = Guard::LeaseHolder {
        worker_id,
        done: &[TaskStatus::Succeeded],
    };
    let change = Change::Complete {
        result: result.as_ref(),
        worker_id,
    };
    let task = retried(db, id, Op::Plain(Transition::Complete, guard, change)).await?;
    crate::metrics::finished("completed");
    crate::executor::notify::run_ended(&mut Executor::on(db)?).await?;
    Ok(task)
}

/// [`TaskLifecycle::fail`](super::TaskLifecycle::fail).
pub(super) async fn fail<C: DedupConnection>(
    db: &C,
    id: Uuid,
    worker_id: &str,
    error: &str,
    retry: Retry,
) -> Result<task_run::Model, DedupError> {
    validate::worker_id(worker_id)?;
    validate::error_text("error", error)?;
    let delay_micros = match retry {
        Retry::Never => None,
        Retry::After(delay) => Some(validate::micros("retry", delay)?),
    };
    let op = Op::Fail {
        worker_id,
        error,
        delay_micros,
    };
    let task = retried(db, id, op).await?;
    if task.status == TaskStatus::Queued {
        crate::metrics::finished("retried");
    } else {
        crate::metrics::finished("failed");
    }
    // A retry due at once is due; either way the key's run is free.
    crate::executor::notify::run_ended(&mut Executor::on(db)?).await?;
    Ok(task)
}

/// [`TaskLifecycle::cancel`](super::TaskLifecycle::cancel).
pub(super) async fn cancel<C: DedupConnection>(
    db: &C,
    id: Uuid,
    reason: &str,
) -> Result<task_run::Model, DedupError> {
    validate::error_text("reason", reason)?;
    let change = Change::Cancel { reason };
    let task = retried(db, id, Op::Plain(Transition::Cancel, Guard::Active, change)).await?;
    crate::metrics::finished("cancelled");
    if task.started_at.is_some() {
        // It may have been running: its key's run is free, and its handler is to stop.
        let mut exec = Executor::on(db)?;
        crate::executor::notify::task_cancelled(&mut exec).await?;
        crate::executor::notify::run_ended(&mut exec).await?;
    }
    Ok(task)
}

/// [`TaskLifecycle::release`](super::TaskLifecycle::release).
pub(super) async fn release<C: DedupConnection>(
    db: &C,
    id: Uuid,
    worker_id: &str,
) -> Result<task_run::Model, DedupError> {
    validate::worker_id(worker_id)?;
    let task = retried(db, id, Op::Release { worker_id }).await?;
    if task.status == TaskStatus::Queued {
        crate::metrics::finished("released");
        crate::executor::notify::task_due(&mut Executor::on(db)?).await?;
    } else {
        crate::metrics::finished("cancelled");
    }
    Ok(task)
}

/// [`TaskLifecycle::snooze`](super::TaskLifecycle::snooze).
pub(super) async fn snooze<C: DedupConnection>(
    db: &C,
    id: Uuid,
    worker_id: &str,
    delay: Duration,
) -> Result<task_run::Model, DedupError> {
    validate::worker_id(worker_id)?;
    let delay_micros = validate::micros("delay", delay)?;
    let task = retried(
        db,
        id,
        Op::Snooze {
            worker_id,
            delay_micros,
        },
    )
    .await?;
    if task.status == TaskStatus::Queued {
        crate::metrics::finished("snoozed");
    } else {
        crate::metrics::finished("cancelled");
    }
    // The key's run is free (a follow-up that may run beside it is due); and a snooze
    // of zero is due at once.
    crate::executor::notify::run_ended(&mut Executor::on(db)?).await?;
    Ok(task)
}

/// One of the lifecycle's operations on a task, as its attempts run it.
#[derive(Clone, Copy)]
enum Op<'a> {
    /// A compare-and-set transition.
    Plain(Transition, Guard<'a>, Change<'a>),
    /// `fail`, with a retry after `delay_micros` or for good.
    Fail {
        worker_id: &'a str,
        error: &'a str,
        delay_micros: Option<i64>,
    },
    /// `release`.
    Release { worker_id: &'a str },
    /// `snooze`, due after `delay_micros`.
    Snooze {
        worker_id: &'a str,
        delay_micros: i64,
    },
}

impl Op<'_> {
    fn name(self) -> &'static str {
        match self {
            Op::Plain(Transition::Heartbeat, ..) => "heartbeat",
            Op::Plain(Transition::Complete, ..) => "complete",
            Op::Plain(Transition::Cancel, ..) => "cancel",
            Op::Plain(Transition::Fail, ..) | Op::Fail { .. } => "fail",
            Op::Plain(Transition::Release, ..) | Op::Release { .. } => "release",
            Op::Plain(Transition::Snooze, ..) | Op::Snooze { .. } => "snooze",
            // The admin's own (`crate::admin`), never run as a lifecycle operation.
            Op::Plain(Transition::Retry, ..) => "retry",
            Op::Plain(Transition::Delete, ..) => "delete",
        }
    }

    /// One attempt.
    async fn attempt(
        self,
        exec: &mut Executor<'_>,
        id: Uuid,
    ) -> Result<task_run::Model, DedupError> {
        match self {
            Op::Plain(transition, guard, change) => {
                apply(exec, transition, id, guard, change).await
            }
            Op::Fail {
                worker_id,
                error,
                delay_micros,
            } => fail_once(exec, id, worker_id, error, delay_micros).await,
            Op::Release { worker_id } => {
                let change = Change::Release { worker_id };
                requeue_once(exec, Transition::Release, id, worker_id, change).await
            }
            Op::Snooze {
                worker_id,
                delay_micros,
            } => {
                let change = Change::Snooze {
                    delay_micros,
                    worker_id,
                };
                requeue_once(exec, Transition::Snooze, id, worker_id, change).await
            }
        }
    }
}

/// Runs `op` on task `id` until it gives an outcome, through the one retry driver:
/// again on a fresh connection after a lost one, and again after a deadlock the database
/// broke by aborting it (outside a caller's transaction). The transitions are idempotent
/// for their caller, so a repeat after an attempt that took effect returns what it
/// stored.
async fn retried<C: DedupConnection>(
    db: &C,
    id: Uuid,
    op: Op<'_>,
) -> Result<task_run::Model, DedupError> {
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, None, op.name());
    loop {
        // Boxed: moved into the retry driver, and a transition's state is large.
        if let Some(outcome) = retrying.run(Box::pin(op.attempt(&mut exec, id))).await {
            return outcome;
        }
    }
}

/// How a change run in a savepoint ended.
enum Savepoint {
    /// Committed: the row as it is now, or `None` when its guard did not match.
    Applied(Option<Box<task_run::Model>>),
    /// Rolled back: the task would have taken a key another task holds (a follow-up
    /// queued behind a `Scope::Queued` task).
    KeyHeld,
}

/// Runs `change` of task `id` in a savepoint or short transaction: on PostgreSQL a
/// unique violation would otherwise abort the caller's transaction.
async fn in_savepoint(
    exec: &mut Executor<'_>,
    id: Uuid,
    change: Change<'_>,
) -> Result<Savepoint, DedupError> {
    let mut txn = exec.begin(false).await?;
    let outcome = txn.transition(id, change).await;
    let held = matches!(&outcome, Err(failure) if failure.is_held_key());
    match txn.finish(outcome).await {
        Ok(task) => Ok(Savepoint::Applied(task.map(Box::new))),
        Err(_) if held => Ok(Savepoint::KeyHeld),
        Err(failure) => Err(failure.into()),
    }
}

/// One attempt of `fail`: the final failure, or the retry (`delay_micros`) in a
/// savepoint; when a follow-up of the key is queued, the final failure instead.
async fn fail_once(
    exec: &mut Executor<'_>,
    id: Uuid,
    worker_id: &str,
    error: &str,
    delay_micros: Option<i64>,
) -> Result<task_run::Model, DedupError> {
    let guard = Guard::LeaseHolder {
        worker_id,
        done: FAILED_OR_RETRIED,
    };
    let Some(delay_micros) = delay_micros else {
        let change = Change::Fail { error, worker_id };
        return apply(exec, Transition::Fail, id, guard, change).await;
    };
    let retry = Change::Retry {
        error,
        delay_micros,
        worker_id,
    };
    match in_savepoint(exec, id, retry).await? {
        Savepoint::Applied(Some(task)) => Ok(*task),
        Savepoint::Applied(None) => not_applied(exec, Transition::Fail, id, guard).await,
        Savepoint::KeyHeld => {
            tracing::info!(task_id = %id, "not retried: a follow-up of this key is queued");
            let error = not_retried(error);
            let change = Change::Fail {
                error: &error,
                worker_id,
            };
            apply(exec, Transition::Fail, id, guard, change).await
        }
    }
}

/// One attempt of `release` or `snooze` (`change`, which puts the running task back in
/// the queue), in a savepoint like `fail`'s retry: a follow-up queued behind a
/// `Scope::Queued` task makes it a cancellation.
async fn requeue_once(
    exec: &mut Executor<'_>,
    transition: Transition,
    id: Uuid,
    worker_id: &str,
    change: Change<'_>,
) -> Result<task_run::Model, DedupError> {
    let guard = Guard::LeaseHolder {
        worker_id,
        done: &[TaskStatus::Queued, TaskStatus::Cancelled],
    };
    match in_savepoint(exec, id, change).await? {
        Savepoint::Applied(Some(task)) => Ok(*task),
        Savepoint::Applied(None) => not_applied(exec, transition, id, guard).await,
        Savepoint::KeyHeld => {
            let reason = match transition {
                Transition::Snooze => {
                    "snoozed by its handler; not requeued: another task of this key is \
                     queued and will do the work"
                }
                _ => {
                    "released by its worker; not requeued: another task of this key is \
                     queued and will do the work"
                }
            };
            apply(exec, transition, id, guard, Change::Cancel { reason }).await
        }
    }
}

/// Where `fail` leaves a task, whichever way it went.
const FAILED_OR_RETRIED: &[TaskStatus] = &[TaskStatus::Failed, TaskStatus::Queued];

/// The error of a task that failed for good because a follow-up of its key is queued.
pub(super) fn not_retried(error: &str) -> String {
    format!("{error} (not retried: another task of this key is queued and will do the work)")
}

/// Applies `change` to task `id` if `guard` holds; otherwise reads the row to say why
/// not, or, when the transition already took effect for this caller (a call repeated
/// after a lost connection), returns the row as stored. The read only explains a
/// refusal; the decision was the UPDATE's.
async fn apply(
    exec: &mut Executor<'_>,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
    change: Change<'_>,
) -> Result<task_run::Model, DedupError> {
    if let Some(task) = exec.transition(id, change).await? {
        tracing::debug!(task_id = %id, %transition, status = %task.status, "task transitioned");
        return Ok(task);
    }
    not_applied(exec, transition, id, guard).await
}

/// Why a transition of task `id` did not apply, read from the row: or its stored row
/// when it had already taken effect for this caller.
pub(super) async fn not_applied(
    exec: &mut Executor<'_>,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
) -> Result<task_run::Model, DedupError> {
    let Some(task) = exec.by_id(id).await? else {
        return Err(DedupError::NotFound { id });
    };
    explain(task, transition, guard)
}

/// Why a transition of `task` did not apply, from the row as read: or the row, when it
/// had already taken effect for this caller.
pub(super) fn explain(
    task: task_run::Model,
    transition: Transition,
    guard: Guard<'_>,
) -> Result<task_run::Model, DedupError> {
    let id = task.id;
    match guard {
        Guard::LeaseHolder { worker_id, done }
            if done.contains(&task.status) && task.lease_owner.as_deref() == Some(worker_id) =>
        {
            tracing::debug!(task_id = %id, %transition, "already done by this worker");
            Ok(task)
        }
        Guard::Active if task.status == TaskStatus::Cancelled => Ok(task),
        Guard::LeaseHolder { worker_id, .. } if task.status == TaskStatus::Running => {
            Err(DedupError::LeaseNotHeld {
                id,
                transition,
                worker_id: worker_id.to_owned(),
                holder: task.lease_owner,
            })
        }
        _ => Err(DedupError::InvalidTransition {
            id,
            transition,
            status: task.status,
        }),
    }
}
