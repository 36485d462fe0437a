//! [`TaskWorker`]: the lifecycle that moves tasks out of the active set, with leases.
//!
//! Every transition is a compare-and-set on `status` (and on `lease_owner` where a
//! lease applies) in one statement, or on MySQL/MariaDB in one short transaction. A
//! transition that does not apply changes nothing and says why; one that already took
//! effect for the same caller returns the stored outcome, so a call repeated after a lost
//! connection is safe.

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::{DbErr, TransactionSession, TransactionTrait};
use uuid::Uuid;

use crate::TaskStatus;
use crate::connection::DedupConnection;
use crate::dialect::{Dialect, Statements};
use crate::error::{DedupError, Transition};
use crate::reconnect::{self, Retrying};
use crate::retry::{Retry, RetryPolicy};
use crate::task_run;
use crate::validate;

/// What [`TaskWorker::reap_expired`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Running tasks whose lease expired, returned to `queued` for another attempt.
    pub requeued: u64,
    /// Running tasks whose lease expired on their last allowed attempt (or that could not
    /// be requeued), now `failed`.
    pub failed: u64,
}

/// The worker side: claim queued tasks under a lease, keep the lease alive, finish or
/// retry tasks, reap the leases of crashed workers and prune old history.
///
/// Lease and due times come from the database's clock, so workers on several machines
/// agree. Implemented for the same handles as [`TaskDedup`](crate::TaskDedup).
#[async_trait]
pub trait TaskWorker {
    /// Atomically moves the next due `queued` task (of `task_types`, or of any type when
    /// empty) to `running`, owned by `worker_id` until now + `lease`: the highest
    /// priority first, then the oldest `run_at`, then the oldest task; a task whose
    /// `run_at` is in the future is not due. Increments `attempts` and sets `started_at`.
    /// Each queued task goes to exactly one worker. `None` when nothing is due.
    ///
    /// A claim lost with its connection is not retried by the library: it may have taken
    /// effect, and its task then comes back when the lease expires and the reaper
    /// requeues it.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for an empty or over-long worker id or task type,
    /// or a lease of zero or over [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`DedupError::Database`].
    async fn claim(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
    ) -> Result<Option<task_run::Model>, DedupError>;

    /// [`claim`](Self::claim) for up to `max` tasks in one statement (one short
    /// transaction on MySQL), in claim order. Empty when nothing is due. A worker that
    /// has several free slots fills them with one round trip instead of one each.
    ///
    /// # Errors
    /// As [`claim`](Self::claim), and [`DedupError::InvalidArgument`] for a `max` of 0 or
    /// over [`MAX_CLAIM`](crate::MAX_CLAIM).
    async fn claim_many(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
        max: usize,
    ) -> Result<Vec<task_run::Model>, DedupError>;

    /// Extends the lease of a task `worker_id` is running to now + `lease`.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task is not
    /// running (it finished, was cancelled, or the reaper requeued it);
    /// [`DedupError::LeaseNotHeld`] when another worker holds it now; as
    /// [`claim`](Self::claim) for the arguments.
    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError>;

    /// `running` → `succeeded` with `result`, releasing the key (unless its scope is a
    /// period window). Repeated by the same worker, returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat); [`DedupError::InvalidArgument`] when `result`
    /// has a NUL character in a string or key.
    async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        result: Option<serde_json::Value>,
    ) -> Result<task_run::Model, DedupError>;

    /// Ends a failed attempt. [`Retry::Never`]: `running` → `failed` with `error`,
    /// releasing the key. [`Retry::After`]: `running` → `queued` with `error` and `run_at`
    /// that far in the future (by the database's clock), in one statement, so the key
    /// stays held throughout and no duplicate can slip in. Use
    /// [`RetryPolicy::after_attempt`] with the task's `attempts` for exponential backoff
    /// with an attempt limit.
    ///
    /// A [`Scope::Queued`](crate::Scope::Queued) task may have a follow-up queued behind
    /// it; then it is not retried but fails for good, its error saying so: the follow-up
    /// does the work. Repeated by the same worker, returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat); [`DedupError::InvalidArgument`] when `error`
    /// has a NUL byte or more than
    /// [`ERROR_MAX_CHARS`](crate::task_run::ERROR_MAX_CHARS) characters, or the delay
    /// does not fit in microseconds.
    async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        error: &str,
        retry: Retry,
    ) -> Result<task_run::Model, DedupError>;

    /// `queued` or `running` → `cancelled` with `reason` in `error`, releasing the key.
    /// Needs no lease: cancelling is the application's decision, not a worker's.
    /// Cancelling a cancelled task returns it as stored.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task already
    /// finished otherwise; [`DedupError::InvalidArgument`] for a `reason` as `fail`
    /// rejects.
    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError>;

    /// Hands a task `worker_id` is running back to the queue: `running` → `queued`, lease
    /// cleared, the attempt not counted (`attempts` back to what it was before the
    /// claim), due at once. For a worker shutting down before its handler finished: the
    /// task does not wait for its lease to expire. The key stays held throughout. A
    /// [`Scope::Queued`](crate::Scope::Queued) task with a follow-up queued behind it is
    /// cancelled instead (the follow-up does the work). Repeated by the same worker,
    /// returns the stored outcome.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat).
    async fn release(&self, id: Uuid, worker_id: &str) -> Result<task_run::Model, DedupError>;

    /// Returns `running` tasks whose lease expired to `queued` (lease cleared) after the
    /// backoff `policy` gives for their attempts, or marks them `failed` once `attempts`
    /// reached `policy.max_attempts`. A heartbeat that extended the lease first wins: the
    /// task stays with its worker. Safe to run from every worker at once: each task is
    /// reaped by exactly one of them. At most 100 tasks per call.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for an invalid policy; [`DedupError::Database`].
    async fn reap_expired(&self, policy: &RetryPolicy) -> Result<ReapReport, DedupError>;

    /// Deletes finished tasks (`succeeded`, `failed`, `cancelled`) whose `finished_at`
    /// is older than `older_than`, except period-scoped tasks whose window is not over
    /// (they still hold it). Never touches an active task. Returns how many rows it
    /// deleted.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] when `older_than` does not fit in microseconds;
    /// [`DedupError::Database`].
    async fn prune_finished(&self, older_than: Duration) -> Result<u64, DedupError>;
}

/// Who may perform a transition, and what its effect looks like once it took effect.
#[derive(Clone, Copy)]
enum Guard<'a> {
    /// The task is running under this worker's lease; afterwards it is in one of the
    /// `done` states with this worker recorded as `lease_owner`.
    LeaseHolder {
        worker_id: &'a str,
        done: &'static [TaskStatus],
    },
    /// The task is queued or running; afterwards it is `cancelled`.
    Active,
}

#[async_trait]
impl<C: DedupConnection> TaskWorker for C {
    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), worker_id = %worker_id, ?task_types))]
    async fn claim(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
    ) -> Result<Option<task_run::Model>, DedupError> {
        Ok(self
            .claim_many(worker_id, task_types, lease, 1)
            .await?
            .pop())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), worker_id = %worker_id, ?task_types, max))]
    async fn claim_many(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
        max: usize,
    ) -> Result<Vec<task_run::Model>, DedupError> {
        validate::worker_id(worker_id)?;
        validate::task_types(task_types)?;
        let lease_micros = validate::lease_micros(lease)?;
        let max = validate::claim_max(max)?;
        let dialect = Dialect::of(self)?;
        // Again after a deadlock, which took nothing; not after a lost connection (see
        // `claim`).
        let mut aborted = 0;
        let claimed = loop {
            let err = match dialect
                .claim(self, worker_id, task_types, lease_micros, max)
                .await
            {
                Ok(claimed) => break claimed,
                Err(err) => DedupError::from(err),
            };
            if !again_after_abort(self, "claim", &mut aborted, &err).await {
                return Err(err);
            }
        };
        for task in &claimed {
            tracing::debug!(task_id = %task.id, worker_id, attempts = task.attempts, "task claimed");
            let waited = task
                .started_at
                .and_then(|started| (started - task.run_at).to_std().ok());
            crate::metrics::claimed(waited.unwrap_or_default());
        }
        Ok(claimed)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), task_id = %id, worker_id = %worker_id))]
    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        let lease_micros = validate::lease_micros(lease)?;
        let dialect = Dialect::of(self)?;
        let guard = Guard::LeaseHolder {
            worker_id,
            done: &[TaskStatus::Running],
        };
        retried(self, "heartbeat", || {
            let values = vec![dialect.duration(lease_micros), id.into(), worker_id.into()];
            transition(
                self,
                dialect,
                Transition::Heartbeat,
                id,
                guard,
                |s| s.heartbeat,
                values,
            )
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), task_id = %id, worker_id = %worker_id))]
    async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        result: Option<serde_json::Value>,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        validate::json("result", result.as_ref())?;
        let dialect = Dialect::of(self)?;
        let guard = Guard::LeaseHolder {
            worker_id,
            done: &[TaskStatus::Succeeded],
        };
        retried(self, "complete", || {
            let values = vec![result.clone().into(), id.into(), worker_id.into()];
            transition(
                self,
                dialect,
                Transition::Complete,
                id,
                guard,
                |s| s.complete,
                values,
            )
        })
        .await
        .inspect(|_| crate::metrics::finished("completed"))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), task_id = %id, worker_id = %worker_id, ?retry))]
    async fn fail(
        &self,
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
        let dialect = Dialect::of(self)?;
        let task = retried(self, "fail", || {
            fail_once(self, dialect, id, worker_id, error, delay_micros)
        })
        .await?;
        if task.status == TaskStatus::Queued {
            crate::metrics::finished("retried");
            if delay_micros == Some(0) {
                crate::wakeup::task_due(self).await?;
            }
        } else {
            crate::metrics::finished("failed");
        }
        Ok(task)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), task_id = %id))]
    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError> {
        validate::error_text("reason", reason)?;
        let dialect = Dialect::of(self)?;
        retried(self, "cancel", || {
            let values = vec![reason.into(), id.into()];
            transition(
                self,
                dialect,
                Transition::Cancel,
                id,
                Guard::Active,
                |s| s.cancel,
                values,
            )
        })
        .await
        .inspect(|_| crate::metrics::finished("cancelled"))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend(), task_id = %id, worker_id = %worker_id))]
    async fn release(&self, id: Uuid, worker_id: &str) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        let dialect = Dialect::of(self)?;
        let task = retried(self, "release", || {
            release_once(self, dialect, id, worker_id)
        })
        .await?;
        if task.status == TaskStatus::Queued {
            crate::metrics::finished("released");
            crate::wakeup::task_due(self).await?;
        } else {
            crate::metrics::finished("cancelled");
        }
        Ok(task)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend()))]
    async fn reap_expired(&self, policy: &RetryPolicy) -> Result<ReapReport, DedupError> {
        policy.validate()?;
        let dialect = Dialect::of(self)?;
        let mut report = ReapReport::default();
        let last_attempt = format!(
            "lease expired on the last allowed attempt (max_attempts = {})",
            policy.max_attempts
        );
        for (id, attempts) in dialect.expired(self).await? {
            let requeued = match policy.after_attempt(attempts) {
                Retry::Never => false,
                Retry::After(delay) => {
                    let delay = dialect.duration(validate::micros("retry", delay)?);
                    match requeue(self, dialect, id, delay).await {
                        Ok(requeued) => {
                            report.requeued += u64::from(requeued);
                            continue;
                        }
                        Err(err) if dialect.is_held_key_violation(&err) => true,
                        Err(err) => return Err(err.into()),
                    }
                }
            };
            let error = if requeued {
                not_retried("lease expired")
            } else {
                last_attempt.clone()
            };
            let failed = dialect
                .reap(self, |s| s.reap_fail, vec![error.into(), id.into()])
                .await?;
            report.failed += u64::from(failed);
        }
        crate::metrics::reaped(report.requeued, report.failed);
        if report.requeued > 0 {
            crate::wakeup::task_due(self).await?;
        }
        if report != ReapReport::default() {
            tracing::info!(
                requeued = report.requeued,
                failed = report.failed,
                "expired leases reaped"
            );
        }
        Ok(report)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(dialect = ?self.get_database_backend()))]
    async fn prune_finished(&self, older_than: Duration) -> Result<u64, DedupError> {
        let micros = validate::micros("older_than", older_than)?;
        let dialect = Dialect::of(self)?;
        let pruned = dialect.prune(self, micros).await?;
        tracing::debug!(pruned, "finished tasks pruned");
        Ok(pruned)
    }
}

/// How often an operation outside a transaction is run again after the database
/// aborted it to break a deadlock.
const MAX_ABORTED_ATTEMPTS: u32 = 8;

/// Runs the operation `make` builds until it gives an outcome: again on a fresh
/// connection after a lost one (on a pool, within the default retry budget), and again
/// after a deadlock the database broke by aborting it (outside a caller's transaction,
/// [`MAX_ABORTED_ATTEMPTS`] times). The transitions are idempotent for their caller, so
/// a repeat after an attempt that took effect returns what it stored; an aborted claim
/// took nothing.
async fn retried<C, T, F, Fut>(
    db: &C,
    operation: &'static str,
    mut make: F,
) -> Result<T, DedupError>
where
    C: DedupConnection,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DedupError>>,
{
    let mut retrying = Retrying::new(db, reconnect::default_retry_budget(), operation);
    let mut aborted = 0;
    loop {
        match retrying.run(make()).await {
            None => {}
            Some(Err(err)) if again_after_abort(db, operation, &mut aborted, &err).await => {}
            Some(outcome) => return outcome,
        }
    }
}

/// Whether to run an operation that failed with `err` again: when the database aborted
/// it to break a deadlock, outside a caller's transaction (whose work is gone with it),
/// fewer than [`MAX_ABORTED_ATTEMPTS`] times; then after a short random pause.
async fn again_after_abort<C: DedupConnection>(
    db: &C,
    operation: &'static str,
    aborted: &mut u32,
    err: &DedupError,
) -> bool {
    if !matches!(err, DedupError::TransactionAborted(_))
        || db.in_transaction()
        || *aborted + 1 >= MAX_ABORTED_ATTEMPTS
    {
        return false;
    }
    *aborted += 1;
    tracing::debug!(operation, attempt = *aborted, error = %err, "aborted by a deadlock; running it again");
    tokio::time::sleep(crate::enqueue::backoff(*aborted)).await;
    true
}

/// One attempt of `fail`: the final failure, or the retry (`delay_micros`) in a
/// savepoint or short transaction: on PostgreSQL a unique violation (a follow-up queued
/// behind a `Scope::Queued` task) would otherwise abort the caller's transaction; then
/// the final failure instead.
async fn fail_once<C: DedupConnection>(
    db: &C,
    dialect: Dialect,
    id: Uuid,
    worker_id: &str,
    error: &str,
    delay_micros: Option<i64>,
) -> Result<task_run::Model, DedupError> {
    let guard = Guard::LeaseHolder {
        worker_id,
        done: FAILED_OR_RETRIED,
    };
    let final_failure = |error: String| {
        let values = vec![error.into(), id.into(), worker_id.into()];
        transition(db, dialect, Transition::Fail, id, guard, |s| s.fail, values)
    };
    let Some(delay_micros) = delay_micros else {
        return final_failure(error.to_owned()).await;
    };
    let values = vec![
        error.into(),
        dialect.duration(delay_micros),
        id.into(),
        worker_id.into(),
    ];
    let txn = db.begin().await?;
    match transition(
        &txn,
        dialect,
        Transition::Fail,
        id,
        guard,
        |s| s.retry,
        values,
    )
    .await
    {
        Ok(task) => {
            txn.commit().await?;
            Ok(task)
        }
        Err(DedupError::Database(err)) if dialect.is_held_key_violation(&err) => {
            txn.rollback().await?;
            tracing::info!(task_id = %id, "not retried: a follow-up of this key is queued");
            final_failure(not_retried(error)).await
        }
        Err(err) => {
            let _ = txn.rollback().await;
            Err(err)
        }
    }
}

/// One attempt of `release`, in a savepoint or short transaction like `fail`'s retry:
/// a follow-up queued behind a `Scope::Queued` task makes the release a cancellation.
async fn release_once<C: DedupConnection>(
    db: &C,
    dialect: Dialect,
    id: Uuid,
    worker_id: &str,
) -> Result<task_run::Model, DedupError> {
    let guard = Guard::LeaseHolder {
        worker_id,
        done: &[TaskStatus::Queued, TaskStatus::Cancelled],
    };
    let values = vec![id.into(), worker_id.into()];
    let txn = db.begin().await?;
    match transition(
        &txn,
        dialect,
        Transition::Release,
        id,
        guard,
        |s| s.release,
        values,
    )
    .await
    {
        Ok(task) => {
            txn.commit().await?;
            Ok(task)
        }
        Err(DedupError::Database(err)) if dialect.is_held_key_violation(&err) => {
            txn.rollback().await?;
            let reason = "released by its worker; not requeued: another task of this key is \
                          queued and will do the work";
            let values = vec![reason.into(), id.into()];
            transition(
                db,
                dialect,
                Transition::Release,
                id,
                guard,
                |s| s.cancel,
                values,
            )
            .await
        }
        Err(err) => {
            let _ = txn.rollback().await;
            Err(err)
        }
    }
}

/// Where `fail` leaves a task, whichever way it went.
const FAILED_OR_RETRIED: &[TaskStatus] = &[TaskStatus::Failed, TaskStatus::Queued];

/// The error of a task that failed for good because a follow-up of its key is queued.
fn not_retried(error: &str) -> String {
    format!("{error} (not retried: another task of this key is queued and will do the work)")
}

/// Requeues expired task `id` after `delay`, in a savepoint or short transaction (a
/// unique violation must not abort a caller's transaction on PostgreSQL). Whether it
/// applied.
async fn requeue<C: DedupConnection>(
    db: &C,
    dialect: Dialect,
    id: Uuid,
    delay: sea_orm::Value,
) -> Result<bool, DbErr> {
    let txn = db.begin().await?;
    match dialect
        .reap(&txn, |s| s.reap_requeue, vec![delay, id.into()])
        .await
    {
        Ok(requeued) => {
            txn.commit().await?;
            Ok(requeued)
        }
        Err(err) => {
            txn.rollback().await?;
            Err(err)
        }
    }
}

/// Applies the transition `pick` selects to task `id` if `guard` holds; otherwise reads
/// the row to say why not, or, when the transition already took effect for this caller
/// (a call repeated after a lost connection), returns the row as stored. The read only
/// explains a refusal; the decision was the UPDATE's.
async fn transition<C: sea_orm::ConnectionTrait + TransactionTrait>(
    db: &C,
    dialect: Dialect,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
    pick: fn(&Statements) -> &'static str,
    values: Vec<sea_orm::Value>,
) -> Result<task_run::Model, DedupError> {
    if let Some(task) = dialect.transition(db, pick, values, id).await? {
        tracing::debug!(task_id = %id, %transition, status = %task.status, "task transitioned");
        return Ok(task);
    }
    not_applied(db, dialect, transition, id, guard).await
}

/// Completes task `id` as [`TaskWorker::complete`] does, without reading it back: the
/// [`Worker`](crate::Worker)'s path, which has no use for the stored row (one statement
/// that returns nothing; MySQL: no transaction around it).
#[cfg_attr(not(feature = "worker"), allow(dead_code))]
pub(crate) async fn complete_quietly<C: DedupConnection>(
    db: &C,
    id: Uuid,
    worker_id: &str,
    result: Option<serde_json::Value>,
) -> Result<(), DedupError> {
    validate::worker_id(worker_id)?;
    validate::json("result", result.as_ref())?;
    let dialect = Dialect::of(db)?;
    let guard = Guard::LeaseHolder {
        worker_id,
        done: &[TaskStatus::Succeeded],
    };
    retried(db, "complete", || async {
        let values = vec![result.clone().into(), id.into(), worker_id.into()];
        if dialect
            .transition_quietly(db, |s| s.complete, values)
            .await?
        {
            tracing::debug!(task_id = %id, transition = %Transition::Complete, "task transitioned");
            return Ok(());
        }
        not_applied(db, dialect, Transition::Complete, id, guard)
            .await
            .map(drop)
    })
    .await?;
    crate::metrics::finished("completed");
    Ok(())
}

/// Why a transition of task `id` did not apply, read from the row: or its stored row
/// when it had already taken effect for this caller.
async fn not_applied<C: sea_orm::ConnectionTrait + TransactionTrait>(
    db: &C,
    dialect: Dialect,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
) -> Result<task_run::Model, DedupError> {
    let Some(task) = dialect.by_id(db, id).await? else {
        return Err(DedupError::NotFound { id });
    };
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
