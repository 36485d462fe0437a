//! [`TaskAdmin`]: see and steer the queue — lists with filters and keyset pages, one
//! task, counts by type and status, throughput, the oldest queued task per type; retry,
//! cancel and delete, one task or in bulk by filter.
//!
//! Reads and writes go through the executor like every operation; lists are the one
//! statement built from parts (`dialect::admin::list`), values always bound.

mod actions;
mod cursor;
mod filter;
mod stats;

use crate::maintenance::limits::{LimitedType, TypeLimits, UserLimit};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use self::cursor::{Cursor, Page};
pub use self::filter::{
    DEFAULT_COUNT_LIMIT, DEFAULT_PAGE_SIZE, ListTasks, MAX_ADMIN_BATCH, MAX_COUNT_LIMIT, Order,
    TaskFilter,
};
pub use self::stats::{MinuteCounts, OldestQueued, StatusCount, Throughput};
use crate::connect::retry::Retrying;
use crate::executor::Executor;
use crate::lifecycle::TaskLifecycle;
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use task_dedup_entity::TaskStatus;
use task_dedup_entity::task_run;

/// What a bulk action ([`TaskAdmin::retry_tasks`], [`cancel_tasks`](TaskAdmin::cancel_tasks),
/// [`delete_tasks`](TaskAdmin::delete_tasks)) did, task by task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BulkOutcome {
    /// Tasks the filter selected in a status the action applies to (at most the limit).
    pub selected: u64,
    /// Of those, the tasks retried, cancelled or deleted.
    pub applied: u64,
    /// Retry only: tasks left as they were because another task holds their key.
    pub key_held: u64,
    /// Tasks that changed status or were removed between the selection and the action,
    /// and were left alone.
    pub skipped: u64,
}

/// The admin side: what an operator (a dashboard, a command) needs to see and steer the
/// queue. Implemented for the same handles as [`TaskDedup`](crate::TaskDedup) — a pool,
/// the caller's transaction, SeaORM's executor, [`WithRetryBudget`](crate::WithRetryBudget)
/// — and sealed likewise. In a transaction, every change is the transaction's: rolled
/// back with it.
///
/// Lists use keyset pagination over `(created_at, id)` ([`Cursor`]), served by the
/// indexes of the admin migration, never `OFFSET`. Invalid input (a limit of 0 or over
/// [`MAX_ADMIN_BATCH`], a task type or user longer than its column, an empty key prefix,
/// an empty time range, a malformed cursor) is rejected before any SQL runs.
///
/// A lost connection on a pool is retried within the handle's retry budget, as for the
/// other operations. A write lost with its connection may have taken effect: its repeat
/// then finds the task already changed and says so (an
/// [`InvalidTransition`](DedupError::InvalidTransition)).
///
/// ```no_run
/// use task_dedup::{DedupError, ListTasks, TaskAdmin, TaskFilter, TaskStatus};
///
/// # async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), DedupError> {
/// // Every failed export, page after page, and retry each that no other task replaced.
/// let mut query = ListTasks::new(TaskFilter::new().status(TaskStatus::Failed).task_type("export"));
/// loop {
///     let page = db.list_tasks(&query).await?;
///     for task in &page.tasks {
///         match db.retry_task(task.id).await {
///             Ok(_) => {}
///             Err(DedupError::KeyHeld { holder, .. }) => println!("{} does it", holder.id),
///             Err(other) => return Err(other),
///         }
///     }
///     let Some(next) = page.next else { break };
///     query = query.after(Some(next));
/// }
/// # Ok(())
/// # }
/// ```
#[async_trait]
pub trait TaskAdmin: crate::values::connection::sealed::Sealed {
    /// One page of the tasks `query` selects, in its order, and the cursor of the next
    /// page. A page read while tasks are inserted or removed neither repeats nor skips a
    /// task that existed throughout: each page starts strictly after the last one.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for a limit of 0 or over [`MAX_ADMIN_BATCH`] or an
    /// invalid filter (see [`TaskAdmin`]); [`DedupError::Database`].
    async fn list_tasks(&self, query: &ListTasks) -> Result<Page, DedupError>;

    /// The task `id`, if it exists.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn get_task(&self, id: Uuid) -> Result<Option<task_run::Model>, DedupError>;

    /// How many tasks there are per type and status (pairs without tasks left out),
    /// ordered by type, then status.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn counts(&self) -> Result<Vec<StatusCount>, DedupError>;

    /// [`counts`](TaskAdmin::counts) for a page that must stay fast on a large table:
    /// each type and status is counted up to `limit` tasks and no further
    /// ([`StatusCount::at_least`] then says so). It reads at most `limit` index entries
    /// per type and status instead of the whole table, in one statement for the types
    /// and one per type; ordered by type, then status. BENCHMARKS.md has its times on
    /// 1,000,000 tasks against `counts`. Dashboards use [`DEFAULT_COUNT_LIMIT`].
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] when `limit` is 0 or above [`MAX_COUNT_LIMIT`]
    /// (before any SQL); [`DedupError::Database`].
    async fn counts_up_to(&self, limit: u64) -> Result<Vec<StatusCount>, DedupError>;

    /// Tasks created, succeeded and failed per minute over the last 60 minutes (the
    /// current one included), from `created_at` and `finished_at`, by the database's
    /// clock.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn throughput(&self) -> Result<Throughput, DedupError>;

    /// The oldest queued task of each type that has one, and its age by the database's
    /// clock: how far behind the workers are. Ordered by type.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn oldest_queued(&self) -> Result<Vec<OldestQueued>, DedupError>;

    /// Puts a `failed` or `cancelled` task back in the queue: `queued`, due now,
    /// `attempts` back to 0 (a fresh attempt budget: the worker's retry policy counts
    /// from there), lease and `finished_at` cleared; `error` keeps the last failure until
    /// the task ends again. Workers are woken.
    ///
    /// Never a duplicate: the unique index decides, in the same statement. When another
    /// task holds the key (a new task was enqueued since), the task is left as it is and
    /// the error names the holder. Of any number of concurrent retries of one task,
    /// exactly one succeeds.
    ///
    /// # Errors
    /// [`DedupError::KeyHeld`] with the task holding the key; [`DedupError::NotFound`];
    /// [`DedupError::InvalidTransition`] when the task is not failed or cancelled (it
    /// was retried meanwhile, or is still active or succeeded); [`DedupError::Database`].
    async fn retry_task(&self, id: Uuid) -> Result<task_run::Model, DedupError>;

    /// `queued` or `running` → `cancelled` with `reason` in `error`, releasing the key:
    /// [`TaskLifecycle::cancel`]. A running task's worker finds its lease gone when it
    /// tries to record its end.
    ///
    /// # Errors
    /// As [`TaskLifecycle::cancel`].
    async fn cancel_task(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError>;

    /// Deletes a finished task (`succeeded`, `failed` or `cancelled`). An active task is
    /// never deleted: cancel it first. Deleting a finished
    /// [`Scope::Period`](crate::Scope::Period) task frees its window: the period's task
    /// can be enqueued again.
    ///
    /// # Errors
    /// [`DedupError::NotFound`]; [`DedupError::InvalidTransition`] when the task is
    /// active; [`DedupError::Database`].
    async fn delete_task(&self, id: Uuid) -> Result<(), DedupError>;

    /// [`retry_task`](Self::retry_task) for up to `limit` failed or cancelled tasks that
    /// `filter` selects (its statuses narrowed to those two), oldest first, one at a
    /// time: each task whose key another task holds is left as it is and counted in
    /// [`BulkOutcome::key_held`].
    ///
    /// # Errors
    /// As [`list_tasks`](Self::list_tasks) for the arguments; a database error stops the
    /// action where it was (the tasks before it stay retried).
    async fn retry_tasks(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<BulkOutcome, DedupError>;

    /// Cancels up to `limit` queued or running tasks that `filter` selects, oldest
    /// first, in one statement, with `reason`.
    ///
    /// # Errors
    /// As [`list_tasks`](Self::list_tasks), and [`DedupError::InvalidArgument`] for a
    /// reason [`TaskLifecycle::cancel`] refuses.
    async fn cancel_tasks(
        &self,
        filter: &TaskFilter,
        limit: usize,
        reason: &str,
    ) -> Result<BulkOutcome, DedupError>;

    /// Deletes up to `limit` finished tasks that `filter` selects, oldest first, in one
    /// statement.
    ///
    /// # Errors
    /// As [`list_tasks`](Self::list_tasks).
    async fn delete_tasks(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<BulkOutcome, DedupError>;

    /// Sets `task_type`'s limits, replacing any it had: how many of its tasks run at
    /// once anywhere, how many per user, how many start per window
    /// ([`TypeLimits`](crate::TypeLimits)). Stored in the database (`task_dedup_limits`),
    /// so every worker of every process enforces them from its next claim on; their
    /// claims of the type run one at a time, each counting its running tasks afresh.
    /// Lowering a limit interrupts nothing: tasks running go on, and no more start until
    /// they are under it. Wakes the workers that wait for notifications.
    ///
    /// ```
    /// # use task_dedup::{DedupError, TaskAdmin, TypeLimits};
    /// # async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), DedupError> {
    /// // At most 2 exports running anywhere, at most 1 of them per user.
    /// db.set_limits("export", &TypeLimits::new().max_running(2).max_running_per_user(1))
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for an empty or over-long `task_type`, or limits
    /// [`TypeLimits::validate`](crate::TypeLimits::validate) refuses, before any SQL;
    /// [`DedupError::Database`].
    async fn set_limits(&self, task_type: &str, limits: &TypeLimits) -> Result<(), DedupError>;

    /// Removes every limit of `task_type`; whether it had any. Its tasks are claimed as
    /// any others' again.
    ///
    /// # Errors
    /// As [`set_limits`](Self::set_limits) for `task_type`.
    async fn clear_limits(&self, task_type: &str) -> Result<bool, DedupError>;

    /// Every limited task type, by name, with its limits, its tasks running now and its
    /// starts in the rate's current window.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn limits(&self) -> Result<Vec<LimitedType>, DedupError>;

    /// Sets the limit across all types: at most `max_running` tasks of one `user_id`
    /// running at once, whatever their types, in every process (a type's own
    /// [`max_running_per_user`](crate::TypeLimits::max_running_per_user) still applies
    /// within it). Stored in the database (the row of the empty type in
    /// `task_dedup_limits`); while it is set, every claim counts each user's running
    /// tasks under that row's lock, so claims run one at a time across every process
    /// (the guide's flow-control chapter has the cost). Lowering it interrupts nothing.
    /// Wakes the workers that wait for notifications.
    ///
    /// ```
    /// # use task_dedup::{DedupError, TaskAdmin};
    /// # async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), DedupError> {
    /// // At most 3 tasks of any one tenant running at once, of all types.
    /// db.set_user_limit(3).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for 0 or more than
    /// [`MAX_LIMIT`](crate::MAX_LIMIT), before any SQL; [`DedupError::Database`].
    async fn set_user_limit(&self, max_running: u32) -> Result<(), DedupError>;

    /// Removes the limit across all types; whether one was set.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn clear_user_limit(&self) -> Result<bool, DedupError>;

    /// The limit across all types, with how many users run tasks now and how many are
    /// at the limit; `None` when none is set.
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn user_limit(&self) -> Result<Option<UserLimit>, DedupError>;
}

/// Runs `$body` (with `$exec` an executor on `$db`) through the retry driver until it
/// gives an outcome: the reads and single statements of this module.
macro_rules! retried {
    ($db:expr, $operation:literal, |$exec:ident| $body:expr) => {{
        let mut $exec = Executor::on($db)?;
        let mut retrying = Retrying::new($db, None, $operation);
        loop {
            // Boxed, as in the lifecycle.
            if let Some(outcome) = retrying.run(Box::pin(async { $body })).await {
                break outcome;
            }
        }
    }};
}

#[async_trait]
impl<C: DedupConnection> TaskAdmin for C {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_tasks(&self, query: &ListTasks) -> Result<Page, DedupError> {
        query.filter.validate()?;
        let limit = filter::limit(query.limit)?;
        let statuses: Vec<&'static str> =
            query.filter.statuses.iter().map(|s| s.as_str()).collect();
        // One more than the page: whether a next page exists, without a second query.
        let args = query
            .filter
            .list_args(&statuses, query.order, query.after, limit + 1);
        let mut tasks = retried!(self, "list_tasks", |exec| Ok(exec.list(&args).await?))?;
        let next = if tasks.len() > query.limit {
            tasks.truncate(query.limit);
            tasks.last().map(Cursor::of)
        } else {
            None
        };
        Ok(Page { tasks, next })
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id))]
    async fn get_task(&self, id: Uuid) -> Result<Option<task_run::Model>, DedupError> {
        retried!(self, "get_task", |exec| Ok(exec.by_id(id).await?))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn counts(&self) -> Result<Vec<StatusCount>, DedupError> {
        let rows = retried!(self, "counts", |exec| Ok(exec.counts().await?))?;
        status_counts(rows, None)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(limit))]
    async fn counts_up_to(&self, limit: u64) -> Result<Vec<StatusCount>, DedupError> {
        let limit = filter::count_limit(limit)?;
        let rows = retried!(self, "counts_up_to", |exec| {
            let mut rows = Vec::new();
            for task_type in exec.task_types().await? {
                // One more than the limit: a count at the limit is exact, one past it is
                // "at least".
                for (status, n) in exec.counts_of_type(&task_type, limit + 1).await? {
                    if n > 0 {
                        rows.push((task_type.clone(), status, n));
                    }
                }
            }
            Ok(rows)
        })?;
        status_counts(rows, Some(limit))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn throughput(&self) -> Result<Throughput, DedupError> {
        let (first, rows) = retried!(self, "throughput", |exec| {
            let now = exec.now().await?;
            // The current minute and the 59 before it (the statement's own window, unless
            // a minute began between the two statements: see below).
            let first = now.timestamp().div_euclid(60) - 59;
            Ok((first, exec.throughput().await?))
        })?;
        let mut minutes = (first..first + 60)
            .map(|minute| {
                Ok(MinuteCounts {
                    minute: minute_start(minute)?,
                    created: 0,
                    succeeded: 0,
                    failed: 0,
                })
            })
            .collect::<Result<Vec<_>, DedupError>>()?;
        for (what, minute, n) in rows {
            let Some(counts) = usize::try_from(minute - first)
                .ok()
                .and_then(|index| minutes.get_mut(index))
            else {
                // A minute the clock read before began after it (or the other way
                // round): outside this hour, the next call counts it.
                continue;
            };
            let n = u64::try_from(n).unwrap_or_default();
            match what.as_str() {
                "created" => counts.created += n,
                "succeeded" => counts.succeeded += n,
                "failed" => counts.failed += n,
                _ => {}
            }
        }
        Ok(Throughput { minutes })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn oldest_queued(&self) -> Result<Vec<OldestQueued>, DedupError> {
        let (now, rows) = retried!(self, "oldest_queued", |exec| {
            let now = exec.now().await?;
            Ok((now, exec.oldest_queued().await?))
        })?;
        Ok(rows
            .into_iter()
            .map(|(task_type, created_at)| OldestQueued {
                task_type,
                created_at,
                age: (now - created_at).to_std().unwrap_or(Duration::ZERO),
            })
            .collect())
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id))]
    async fn retry_task(&self, id: Uuid) -> Result<task_run::Model, DedupError> {
        let task = retried!(self, "retry", |exec| actions::retry(&mut exec, id).await)?;
        crate::executor::notify::task_due(&mut Executor::on(self)?).await?;
        Ok(task)
    }

    async fn cancel_task(&self, id: Uuid, reason: &str) -> Result<task_run::Model, DedupError> {
        TaskLifecycle::cancel(self, id, reason).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_id = %id))]
    async fn delete_task(&self, id: Uuid) -> Result<(), DedupError> {
        retried!(self, "delete", |exec| actions::delete(&mut exec, id).await)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(limit))]
    async fn retry_tasks(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<BulkOutcome, DedupError> {
        let selected = select(
            self,
            filter,
            limit,
            &[TaskStatus::Failed, TaskStatus::Cancelled],
        )
        .await?;
        let mut outcome = BulkOutcome {
            selected: selected.len() as u64,
            ..BulkOutcome::default()
        };
        for task in &selected {
            match retried!(self, "retry", |exec| actions::retry(&mut exec, task.id)
                .await)
            {
                Ok(_) => outcome.applied += 1,
                Err(DedupError::KeyHeld { .. }) => outcome.key_held += 1,
                Err(DedupError::InvalidTransition { .. } | DedupError::NotFound { .. }) => {
                    outcome.skipped += 1;
                }
                Err(err) => return Err(err),
            }
        }
        if outcome.applied > 0 {
            crate::executor::notify::task_due(&mut Executor::on(self)?).await?;
        }
        Ok(outcome)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(limit))]
    async fn cancel_tasks(
        &self,
        filter: &TaskFilter,
        limit: usize,
        reason: &str,
    ) -> Result<BulkOutcome, DedupError> {
        crate::values::validate::error_text("reason", reason)?;
        let selected = select(self, filter, limit, &TaskStatus::ACTIVE).await?;
        let ids: Vec<Uuid> = selected.iter().map(|task| task.id).collect();
        let applied = retried!(self, "cancel", |exec| Ok(exec
            .cancel_many(reason, &ids)
            .await?))?;
        if applied > 0 {
            // Running tasks among them freed their keys' runs, and their handlers are to
            // stop.
            let mut exec = Executor::on(self)?;
            if selected
                .iter()
                .any(|task| task.status == TaskStatus::Running)
            {
                crate::executor::notify::task_cancelled(&mut exec).await?;
            }
            crate::executor::notify::run_ended(&mut exec).await?;
        }
        Ok(bulk_outcome(ids.len(), applied))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(limit))]
    async fn delete_tasks(
        &self,
        filter: &TaskFilter,
        limit: usize,
    ) -> Result<BulkOutcome, DedupError> {
        let finished = [
            TaskStatus::Succeeded,
            TaskStatus::Failed,
            TaskStatus::Cancelled,
        ];
        let selected = select(self, filter, limit, &finished).await?;
        let ids: Vec<Uuid> = selected.iter().map(|task| task.id).collect();
        let applied = retried!(self, "delete", |exec| Ok(exec.delete_many(&ids).await?))?;
        Ok(bulk_outcome(ids.len(), applied))
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_type = %task_type))]
    async fn set_limits(&self, task_type: &str, limits: &TypeLimits) -> Result<(), DedupError> {
        crate::maintenance::limits::set(self, task_type, limits).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(task_type = %task_type))]
    async fn clear_limits(&self, task_type: &str) -> Result<bool, DedupError> {
        crate::maintenance::limits::clear(self, task_type).await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn limits(&self) -> Result<Vec<LimitedType>, DedupError> {
        crate::maintenance::limits::list(self).await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(max_running))]
    async fn set_user_limit(&self, max_running: u32) -> Result<(), DedupError> {
        crate::maintenance::limits::set_user_limit(self, max_running).await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn clear_user_limit(&self) -> Result<bool, DedupError> {
        crate::maintenance::limits::clear_user_limit(self).await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn user_limit(&self) -> Result<Option<UserLimit>, DedupError> {
        crate::maintenance::limits::user_limit(self).await
    }
}

/// Up to `limit` tasks `filter` selects in one of the `allowed` statuses, oldest first:
/// what a bulk action acts on. Empty, without SQL, when the filter's statuses and
/// `allowed` have none in common.
async fn select<C: DedupConnection>(
    db: &C,
    filter: &TaskFilter,
    limit: usize,
    allowed: &[TaskStatus],
) -> Result<Vec<task_run::Model>, DedupError> {
    filter.validate()?;
    let limit = filter::limit(limit)?;
    let statuses = filter.statuses_within(allowed);
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    let args = filter.list_args(&statuses, Order::OldestFirst, None, limit);
    retried!(db, "select", |exec| Ok(exec.list(&args).await?))
}

/// Rows of (type, status, count) as [`StatusCount`]s; with `limit`, a count past it (one
/// more, where the walk stopped) shown as the limit and flagged.
fn status_counts(
    rows: Vec<(String, String, i64)>,
    limit: Option<i64>,
) -> Result<Vec<StatusCount>, DedupError> {
    rows.into_iter()
        .map(|(task_type, status, count)| {
            let (count, at_least) = match limit {
                Some(limit) if count > limit => (limit, true),
                _ => (count, false),
            };
            Ok(StatusCount {
                task_type,
                status: stored_status(&status)?,
                count: u64::try_from(count).unwrap_or_default(),
                at_least,
            })
        })
        .collect()
}

fn bulk_outcome(selected: usize, applied: u64) -> BulkOutcome {
    let selected = selected as u64;
    BulkOutcome {
        selected,
        applied,
        key_held: 0,
        skipped: selected.saturating_sub(applied),
    }
}

/// The start of a minute counted from the epoch.
fn minute_start(minute: i64) -> Result<DateTime<Utc>, DedupError> {
    minute
        .checked_mul(60)
        .and_then(|seconds| DateTime::from_timestamp(seconds, 0))
        .ok_or_else(|| {
            DedupError::Database(sea_orm::DbErr::Custom(format!(
                "task-dedup: the database's clock is out of range (minute {minute})"
            )))
        })
}

/// A status read from the table.
fn stored_status(status: &str) -> Result<TaskStatus, DedupError> {
    status.parse().map_err(|_| {
        DedupError::Database(sea_orm::DbErr::Type(format!(
            "task-dedup: unknown task status {status:?} in task_run"
        )))
    })
}
