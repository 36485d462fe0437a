//! [`TaskFilter`]: which tasks a list or a bulk action is about; [`ListTasks`]: a list
//! query (filter, order, page size, cursor). Both are checked here before any SQL runs.

use chrono::{DateTime, Utc};

use super::Cursor;
use crate::executor::ListArgs;
use crate::values::validate::{self, InvalidArgument};
use task_dedup_entity::TaskStatus;
use task_dedup_entity::task_run::{
    self, RESOURCE_KEY_MAX_CHARS, TASK_TYPE_MAX_CHARS, USER_ID_MAX_CHARS,
};

/// The most tasks one page holds, and one bulk action touches.
pub const MAX_ADMIN_BATCH: usize = 1_000;

/// The page size of a [`ListTasks`] that does not set one.
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// The limit a dashboard passes to [`TaskAdmin::counts_up_to`](crate::TaskAdmin::counts_up_to):
/// exact below 1,000 tasks per type and status, "1,000+" from there.
pub const DEFAULT_COUNT_LIMIT: u64 = 1_000;

/// The largest limit [`TaskAdmin::counts_up_to`](crate::TaskAdmin::counts_up_to) takes.
/// Past it the capped walks stop paying: on PostgreSQL with 1,000,000 tasks a limit of
/// 10,000 took 356 ms (the full [`TaskAdmin::counts`](crate::TaskAdmin::counts): 350-470
/// ms), and its plan's estimated cost passed `jit_above_cost`, so JIT compilation added
/// 0.5-2 s more (BENCHMARKS.md).
pub const MAX_COUNT_LIMIT: u64 = 1_000;

/// Which tasks a list or a bulk action is about: every condition set must hold. The
/// default is every task.
///
/// ```
/// use task_dedup::{TaskFilter, TaskStatus};
///
/// let failed_exports = TaskFilter::new()
///     .status(TaskStatus::Failed)
///     .task_type("export")
///     .key_prefix("report/2026-");
/// # let _ = failed_exports;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskFilter {
    /// Tasks in one of these statuses (any status when empty).
    pub statuses: Vec<TaskStatus>,
    /// Tasks of this type.
    pub task_type: Option<String>,
    /// Tasks of this user (`""`: keys [without a user](crate::TaskKey::without_user)).
    pub user_id: Option<String>,
    /// Tasks whose resource key starts with this, byte for byte (`%` and `_` are
    /// characters like any other, not wildcards).
    pub key_prefix: Option<String>,
    /// Tasks created at or after this instant.
    pub created_from: Option<DateTime<Utc>>,
    /// Tasks created before this instant.
    pub created_before: Option<DateTime<Utc>>,
}

impl TaskFilter {
    /// Every task.
    pub fn new() -> TaskFilter {
        TaskFilter::default()
    }

    /// Adds a status the tasks may be in.
    pub fn status(mut self, status: TaskStatus) -> TaskFilter {
        if !self.statuses.contains(&status) {
            self.statuses.push(status);
        }
        self
    }

    /// Adds statuses the tasks may be in.
    pub fn statuses(self, statuses: impl IntoIterator<Item = TaskStatus>) -> TaskFilter {
        statuses.into_iter().fold(self, TaskFilter::status)
    }

    /// Only tasks of this type.
    pub fn task_type(mut self, task_type: impl Into<String>) -> TaskFilter {
        self.task_type = Some(task_type.into());
        self
    }

    /// Only tasks of this user.
    pub fn user_id(mut self, user_id: impl Into<String>) -> TaskFilter {
        self.user_id = Some(user_id.into());
        self
    }

    /// Only tasks whose resource key starts with `prefix`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> TaskFilter {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Only tasks created at or after `from`.
    pub fn created_from(mut self, from: DateTime<Utc>) -> TaskFilter {
        self.created_from = Some(from);
        self
    }

    /// Only tasks created before `before`.
    pub fn created_before(mut self, before: DateTime<Utc>) -> TaskFilter {
        self.created_before = Some(before);
        self
    }

    /// Checks every condition against the columns' limits.
    pub(crate) fn validate(&self) -> Result<(), InvalidArgument> {
        if let Some(task_type) = &self.task_type {
            validate::text(task_type, TASK_TYPE_MAX_CHARS)
                .map_err(|reason| InvalidArgument::new("task_type", reason))?;
        }
        if let Some(user_id) = &self.user_id {
            // Empty is a user: the keys without one.
            validate::free_text(user_id, USER_ID_MAX_CHARS)
                .map_err(|reason| InvalidArgument::new("user_id", reason))?;
        }
        if let Some(prefix) = &self.key_prefix {
            validate::text(prefix, RESOURCE_KEY_MAX_CHARS)
                .map_err(|reason| InvalidArgument::new("key_prefix", reason))?;
        }
        if let (Some(from), Some(before)) = (self.created_from, self.created_before)
            && from >= before
        {
            return Err(InvalidArgument::out_of_range(
                "created_before",
                "after created_from",
            ));
        }
        Ok(())
    }

    /// The statuses of the filter that `allowed` holds (all of `allowed` when the
    /// filter names none), as stored.
    pub(crate) fn statuses_within(&self, allowed: &[TaskStatus]) -> Vec<&'static str> {
        allowed
            .iter()
            .filter(|s| self.statuses.is_empty() || self.statuses.contains(s))
            .map(|s| s.as_str())
            .collect()
    }

    /// The list's arguments for `statuses` (already narrowed), `limit` rows.
    pub(crate) fn list_args<'a>(
        &'a self,
        statuses: &'a [&'static str],
        order: Order,
        after: Option<Cursor>,
        limit: i64,
    ) -> ListArgs<'a> {
        ListArgs {
            statuses,
            task_type: self.task_type.as_deref(),
            user_id: self.user_id.as_deref(),
            key_prefix: self.key_prefix.as_deref(),
            created_from: self.created_from.map(task_run::micros),
            created_before: self.created_before.map(task_run::micros),
            after: after.map(Cursor::position),
            newest_first: order == Order::NewestFirst,
            limit,
        }
    }
}

/// The order of a list: by creation time, then id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Order {
    /// The newest task first (the default).
    #[default]
    NewestFirst,
    /// The oldest task first.
    OldestFirst,
}

/// A list query for [`TaskAdmin::list_tasks`](crate::TaskAdmin::list_tasks): the tasks
/// a [`TaskFilter`] selects, in an [`Order`], a page of `limit` at a time, after a
/// [`Cursor`].
///
/// ```
/// use task_dedup::{ListTasks, Order, TaskFilter, TaskStatus};
///
/// let first = ListTasks::new(TaskFilter::new().status(TaskStatus::Failed))
///     .order(Order::OldestFirst)
///     .limit(100);
/// # let _ = first;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListTasks {
    /// Which tasks.
    pub filter: TaskFilter,
    /// In which order.
    pub order: Order,
    /// How many per page: 1 to [`MAX_ADMIN_BATCH`] ([`DEFAULT_PAGE_SIZE`] unless set).
    pub limit: usize,
    /// The page after this position (the previous page's [`Page::next`](crate::Page)),
    /// or the first page.
    pub after: Option<Cursor>,
}

impl ListTasks {
    /// The first page of the tasks `filter` selects, newest first, [`DEFAULT_PAGE_SIZE`]
    /// of them.
    pub fn new(filter: TaskFilter) -> ListTasks {
        ListTasks {
            filter,
            order: Order::default(),
            limit: DEFAULT_PAGE_SIZE,
            after: None,
        }
    }

    /// In this order.
    pub fn order(mut self, order: Order) -> ListTasks {
        self.order = order;
        self
    }

    /// This many per page.
    pub fn limit(mut self, limit: usize) -> ListTasks {
        self.limit = limit;
        self
    }

    /// The page after `cursor` (or the first page with `None`).
    pub fn after(mut self, cursor: Option<Cursor>) -> ListTasks {
        self.after = cursor;
        self
    }
}

/// A page size or a bulk action's limit, as SQL binds it: 1 to [`MAX_ADMIN_BATCH`].
pub(crate) fn limit(limit: usize) -> Result<i64, InvalidArgument> {
    bounded(
        limit as u64,
        MAX_ADMIN_BATCH as u64,
        "1 to 1,000 (MAX_ADMIN_BATCH)",
    )
}

/// A limit of [`TaskAdmin::counts_up_to`](crate::TaskAdmin::counts_up_to), as SQL binds
/// it: 1 to [`MAX_COUNT_LIMIT`].
pub(crate) fn count_limit(limit: u64) -> Result<i64, InvalidArgument> {
    bounded(limit, MAX_COUNT_LIMIT, "1 to 1,000 (MAX_COUNT_LIMIT)")
}

/// `limit` if it is 1 to `max` (both far below `i64::MAX`), else the error naming `range`.
fn bounded(limit: u64, max: u64, range: &'static str) -> Result<i64, InvalidArgument> {
    if limit == 0 || limit > max {
        return Err(InvalidArgument::out_of_range("limit", range));
    }
    Ok(limit as i64)
}
