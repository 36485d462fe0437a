//! [`TaskWorker`]: the lifecycle that moves tasks out of the active set, with leases.
//!
//! Every transition is a compare-and-set on `status` (and on `lease_owner` where a
//! lease applies) in one statement, or on MySQL/MariaDB in one short transaction. A
//! transition that does not apply changes nothing and says why.

use std::time::Duration;

use async_trait::async_trait;
use sea_orm::sea_query::{Expr, ExprTrait, Query, UpdateStatement};
use sea_orm::{EntityTrait, Value};
use task_dedup_entity::active_status_sql;
use uuid::Uuid;

use crate::TaskStatus;
use crate::connection::DedupConnection;
use crate::dialect::Dialect;
use crate::error::{DedupError, InvalidReason, Transition};
use crate::task_run::{self, Column};
use crate::validate;

/// What [`TaskWorker::reap_expired`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Running tasks whose lease expired, returned to `queued` for another attempt.
    pub requeued: u64,
    /// Running tasks whose lease expired after their last allowed attempt, now `failed`.
    pub failed: u64,
}

/// The worker side: claim queued tasks under a lease, keep the lease alive, finish
/// tasks, reap the leases of crashed workers and prune old history.
///
/// Lease times come from the database's clock, so workers on several machines agree.
/// Implemented for the same handles as [`TaskDedup`](crate::TaskDedup).
#[async_trait]
pub trait TaskWorker {
    /// Atomically moves the oldest `queued` task (of `task_types`, or of any type when
    /// empty) to `running`, owned by `worker_id` until now + `lease`. Increments
    /// `attempts` and sets `started_at`. Each queued task goes to exactly one worker.
    /// `None` when nothing is queued.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for an empty or over-long worker id or task type,
    /// or a lease of zero or over [`MAX_LEASE`](crate::MAX_LEASE); [`DedupError::Database`].
    async fn claim(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
    ) -> Result<Option<task_run::Model>, DedupError>;

    /// Extends the lease of a task `worker_id` is running to now + `lease`.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task is not
    /// running (for instance the reaper requeued it); [`DedupError::LeaseNotHeld`] when
    /// another worker holds it now; as [`claim`](Self::claim) for the arguments.
    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError>;

    /// `running` → `succeeded` with `result`, releasing the key.
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

    /// `running` → `failed` with `error`, releasing the key.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat); [`DedupError::InvalidArgument`] when `error`
    /// has a NUL byte or more than [`ERROR_MAX_CHARS`](crate::task_run::ERROR_MAX_CHARS)
    /// characters.
    async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        error: &str,
    ) -> Result<task_run::Model, DedupError>;

    /// `queued` or `running` → `cancelled` with `reason` in `error`, releasing the key.
    /// Needs no lease: cancelling is the application's decision, not a worker's.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task already
    /// finished; [`DedupError::InvalidArgument`] for a `reason` as `fail` rejects.
    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError>;

    /// Returns `running` tasks whose lease expired to `queued` (lease cleared), or marks
    /// them `failed` once `attempts` reached `max_attempts`. A heartbeat that extended
    /// the lease first wins: the task stays with its worker.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] when `max_attempts < 1`; [`DedupError::Database`].
    async fn reap_expired(&self, max_attempts: i32) -> Result<ReapReport, DedupError>;

    /// Deletes finished tasks (`succeeded`, `failed`, `cancelled`) whose `finished_at`
    /// is older than `older_than`. Never touches an active task. Returns how many rows
    /// it deleted.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] when `older_than` does not fit in microseconds;
    /// [`DedupError::Database`].
    async fn prune_finished(&self, older_than: Duration) -> Result<u64, DedupError>;
}

/// Who may perform a transition.
enum Guard<'a> {
    /// The task is running under this worker's lease.
    LeaseHolder(&'a str),
    /// The task is active; no lease needed.
    Active,
}

#[async_trait]
impl<C: DedupConnection> TaskWorker for C {
    async fn claim(
        &self,
        worker_id: &str,
        task_types: &[&str],
        lease: Duration,
    ) -> Result<Option<task_run::Model>, DedupError> {
        validate::worker_id(worker_id)?;
        validate::task_types(task_types)?;
        let lease_micros = validate::lease_micros(lease)?;
        let dialect = Dialect::of(self)?;
        let claimed = dialect
            .claim(self, worker_id, task_types, lease_micros)
            .await?;
        if let Some(task) = &claimed {
            tracing::debug!(task_id = %task.id, worker_id, attempts = task.attempts, "task claimed");
        }
        Ok(claimed)
    }

    async fn heartbeat(
        &self,
        id: Uuid,
        worker_id: &str,
        lease: Duration,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        let lease_micros = validate::lease_micros(lease)?;
        let dialect = Dialect::of(self)?;
        let update = Query::update()
            .table(task_run::Entity)
            .value(Column::LeaseExpiresAt, dialect.now_plus(lease_micros))
            .value(Column::UpdatedAt, dialect.now())
            .to_owned();
        transition(
            self,
            dialect,
            Transition::Heartbeat,
            id,
            Guard::LeaseHolder(worker_id),
            update,
        )
        .await
    }

    async fn complete(
        &self,
        id: Uuid,
        worker_id: &str,
        result: Option<serde_json::Value>,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        validate::json("result", result.as_ref())?;
        let dialect = Dialect::of(self)?;
        let update = finish(dialect, TaskStatus::Succeeded)
            .value(Column::Result, result)
            .to_owned();
        transition(
            self,
            dialect,
            Transition::Complete,
            id,
            Guard::LeaseHolder(worker_id),
            update,
        )
        .await
    }

    async fn fail(
        &self,
        id: Uuid,
        worker_id: &str,
        error: &str,
    ) -> Result<task_run::Model, DedupError> {
        validate::worker_id(worker_id)?;
        validate::error_text("error", error)?;
        let dialect = Dialect::of(self)?;
        let update = finish(dialect, TaskStatus::Failed)
            .value(Column::Error, error)
            .to_owned();
        transition(
            self,
            dialect,
            Transition::Fail,
            id,
            Guard::LeaseHolder(worker_id),
            update,
        )
        .await
    }

    async fn cancel(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError> {
        validate::error_text("reason", reason)?;
        let dialect = Dialect::of(self)?;
        let update = finish(dialect, TaskStatus::Cancelled)
            .value(Column::Error, reason)
            .to_owned();
        transition(self, dialect, Transition::Cancel, id, Guard::Active, update).await
    }

    async fn reap_expired(&self, max_attempts: i32) -> Result<ReapReport, DedupError> {
        if max_attempts < 1 {
            return Err(DedupError::InvalidArgument {
                name: "max_attempts",
                reason: InvalidReason::OutOfRange("at least 1"),
            });
        }
        let dialect = Dialect::of(self)?;
        let expired = |update: &mut UpdateStatement| {
            update
                .and_where(Expr::col(Column::Status).eq(TaskStatus::Running.as_str()))
                .and_where(Expr::col(Column::LeaseExpiresAt).lt(dialect.now()));
        };
        let mut fail = finish(dialect, TaskStatus::Failed)
            .value(
                Column::Error,
                format!(
                    "lease expired on the last allowed attempt (max_attempts = {max_attempts})"
                ),
            )
            .and_where(Expr::col(Column::Attempts).gte(max_attempts))
            .to_owned();
        expired(&mut fail);
        let mut requeue = Query::update()
            .table(task_run::Entity)
            .value(Column::Status, TaskStatus::Queued.as_str())
            .value(Column::LeaseOwner, Value::String(None))
            .value(Column::LeaseExpiresAt, Value::ChronoDateTimeUtc(None))
            .value(Column::UpdatedAt, dialect.now())
            .and_where(Expr::col(Column::Attempts).lt(max_attempts))
            .to_owned();
        expired(&mut requeue);

        let report = ReapReport {
            failed: self.execute(&fail).await?.rows_affected(),
            requeued: self.execute(&requeue).await?.rows_affected(),
        };
        if report != ReapReport::default() {
            tracing::info!(
                requeued = report.requeued,
                failed = report.failed,
                "expired leases reaped"
            );
        }
        Ok(report)
    }

    async fn prune_finished(&self, older_than: Duration) -> Result<u64, DedupError> {
        let micros = validate::micros("older_than", older_than)?;
        let dialect = Dialect::of(self)?;
        let delete = Query::delete()
            .from_table(task_run::Entity)
            .and_where(Expr::cust(active_status_sql()).not())
            .and_where(Expr::col(Column::FinishedAt).lt(dialect.now_plus(-micros)))
            .to_owned();
        let pruned = self.execute(&delete).await?.rows_affected();
        tracing::debug!(pruned, "finished tasks pruned");
        Ok(pruned)
    }
}

/// The common part of every transition out of the active set: new status, the
/// database's clock in `finished_at`/`updated_at`, lease expiry cleared. `lease_owner`
/// stays, as a record of who ran it.
fn finish(dialect: Dialect, status: TaskStatus) -> UpdateStatement {
    Query::update()
        .table(task_run::Entity)
        .value(Column::Status, status.as_str())
        .value(Column::FinishedAt, dialect.now())
        .value(Column::UpdatedAt, dialect.now())
        .value(Column::LeaseExpiresAt, Value::ChronoDateTimeUtc(None))
        .to_owned()
}

/// Applies `update` to task `id` if `guard` holds; otherwise reads the row to say why
/// not. The read only explains a refusal; the decision was the UPDATE's.
async fn transition<C: DedupConnection>(
    db: &C,
    dialect: Dialect,
    transition: Transition,
    id: Uuid,
    guard: Guard<'_>,
    mut update: UpdateStatement,
) -> Result<task_run::Model, DedupError> {
    match guard {
        Guard::LeaseHolder(worker_id) => update
            .and_where(Expr::col(Column::Status).eq(TaskStatus::Running.as_str()))
            .and_where(Expr::col(Column::LeaseOwner).eq(worker_id)),
        Guard::Active => update.and_where(Expr::cust(active_status_sql())),
    };
    if let Some(task) = dialect.update_returning(db, update, id).await? {
        tracing::debug!(task_id = %id, %transition, status = %task.status, "task transitioned");
        return Ok(task);
    }
    let current = task_run::Entity::find_by_id(id).one(db).await?;
    Err(match current {
        None => DedupError::NotFound { id },
        Some(task) => match guard {
            Guard::LeaseHolder(worker_id) if task.status == TaskStatus::Running => {
                DedupError::LeaseNotHeld {
                    id,
                    transition,
                    worker_id: worker_id.to_owned(),
                    holder: task.lease_owner,
                }
            }
            _ => DedupError::InvalidTransition {
                id,
                transition,
                status: task.status,
            },
        },
    })
}
