//! What the overview shows: [`StatusCount`], [`Throughput`], [`OldestQueued`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use task_dedup_entity::TaskStatus;

/// How many tasks of a type are in a status ([`TaskAdmin::counts`](crate::TaskAdmin::counts)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatusCount {
    /// The task type.
    pub task_type: String,
    /// The status.
    pub status: TaskStatus,
    /// How many tasks of the type are in it (never 0: absent pairs are not listed).
    pub count: u64,
    /// From [`TaskAdmin::counts_up_to`](crate::TaskAdmin::counts_up_to) only: the count
    /// stopped at the limit, so there are *at least* `count` tasks (show it as
    /// "1,000+"). Always `false` from [`TaskAdmin::counts`](crate::TaskAdmin::counts).
    pub at_least: bool,
}

/// Tasks created and ended per minute over the last hour
/// ([`TaskAdmin::throughput`](crate::TaskAdmin::throughput)), read from the table's own
/// timestamps by the database's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Throughput {
    /// 60 minutes, oldest first; the last is the current minute, still running.
    pub minutes: Vec<MinuteCounts>,
}

/// One minute of [`Throughput`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MinuteCounts {
    /// The minute's start (UTC).
    pub minute: DateTime<Utc>,
    /// Tasks created in it (`created_at`).
    pub created: u64,
    /// Tasks that succeeded in it (`finished_at`, and still `succeeded`).
    pub succeeded: u64,
    /// Tasks that failed for good in it (`finished_at`, and still `failed`; a task an
    /// operator retried since is no longer counted).
    pub failed: u64,
}

/// The oldest queued task of a type ([`TaskAdmin::oldest_queued`](crate::TaskAdmin::oldest_queued)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OldestQueued {
    /// The task type.
    pub task_type: String,
    /// When its oldest queued task was created.
    pub created_at: DateTime<Utc>,
    /// How long ago that was, by the database's clock.
    pub age: Duration,
}
