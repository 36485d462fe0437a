//! [`NewTask`] and the dedup policies it carries: [`Scope`] (which states hold the key)
//! and [`OnConflict`] (what a hit does).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::values::key::TaskKey;
use crate::values::validate::{self, InvalidArgument};
use task_dedup_entity::task_run::{self, TaskScope, TaskStatus};

/// Which of a task's states hold its key. Stored on the task when it is created and
/// enforced by the database's unique index; tasks of one key may use different scopes,
/// and each holds the key by its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// The key is held while the task is `queued` or `running`: one task in flight per
    /// key. The default.
    #[default]
    Active,
    /// The key is held only while the task is `queued`: with one task running, a new
    /// request queues a follow-up (so the change it reacts to is not lost), and further
    /// requests get that follow-up.
    Queued,
    /// At most one task per key per period window, whatever its status, finished tasks
    /// included (a throttle). The window is the task's creation time truncated to the
    /// period, as River's `ByPeriod` does; different periods give different windows.
    /// Whole seconds, at least one.
    Period(Duration),
}

impl Scope {
    /// What is stored in the `scope` column.
    pub fn stored(self) -> TaskScope {
        match self {
            Scope::Active => TaskScope::Active,
            Scope::Queued => TaskScope::Queued,
            Scope::Period(_) => TaskScope::Period,
        }
    }

    /// The `dedup_window_end` of a task created at `created_at`: the end of its period
    /// window in Unix seconds, or 0 for the other scopes.
    pub(crate) fn window_end(self, created_at: DateTime<Utc>) -> i64 {
        match self {
            Scope::Period(period) => {
                let period = i64::try_from(period.as_secs()).unwrap_or(i64::MAX).max(1);
                let now = created_at.timestamp();
                now.div_euclid(period)
                    .saturating_add(1)
                    .saturating_mul(period)
            }
            Scope::Active | Scope::Queued => 0,
        }
    }

    fn validate(self) -> Result<(), InvalidArgument> {
        match self {
            Scope::Period(period)
                if period.as_secs() == 0
                    || period.subsec_nanos() != 0
                    || i64::try_from(period.as_secs()).is_err() =>
            {
                Err(InvalidArgument::out_of_range(
                    "scope",
                    "a period of whole seconds, at least one",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// What `find_or_enqueue` does when the key is already held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnConflict {
    /// Return the task that holds the key, as stored; write nothing. The default.
    #[default]
    ReturnExisting,
    /// Latest request wins (debounce): if the task holding the key is still `queued`, its
    /// payload, `run_at` and priority become this request's, in the same atomic step, and
    /// the outcome is [`Enqueued::Replaced`](crate::Enqueued::Replaced). A task that is
    /// running or finished is never modified: the outcome is then `Existing`.
    ReplaceIfQueued,
}

/// A task to enqueue: its key, an optional JSON payload, and its policies.
///
/// ```
/// use std::time::Duration;
/// use task_dedup::{NewTask, OnConflict, Scope, TaskKey};
///
/// let task = NewTask::new(TaskKey::new("user-1", "render", "doc/42")?)
///     .with_payload(serde_json::json!({"revision": 7}))
///     .scope(Scope::Queued)
///     .on_conflict(OnConflict::ReplaceIfQueued)
///     .run_at(chrono::Utc::now() + Duration::from_secs(2))
///     .priority(10);
/// # Ok::<(), task_dedup::DedupError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct NewTask {
    pub(crate) key: TaskKey,
    pub(crate) payload: Option<serde_json::Value>,
    pub(crate) scope: Scope,
    pub(crate) on_conflict: OnConflict,
    pub(crate) run_at: Option<DateTime<Utc>>,
    pub(crate) priority: i16,
    pub(crate) concurrent: bool,
    pub(crate) retry_budget: Option<Duration>,
    /// A [`Scope::Period`] window's end (Unix seconds) fixed by the caller rather than
    /// derived from the creation time: a periodic tick's window is `[tick, next tick)`
    /// whenever, and by whichever process, it is enqueued.
    pub(crate) window_end: Option<i64>,
}

impl NewTask {
    /// A task for `key`: no payload, [`Scope::Active`], [`OnConflict::ReturnExisting`],
    /// runnable at once, priority 0, one run per key at a time (not
    /// [`concurrent`](Self::concurrent)).
    pub fn new(key: TaskKey) -> NewTask {
        NewTask {
            key,
            payload: None,
            scope: Scope::default(),
            on_conflict: OnConflict::default(),
            run_at: None,
            priority: 0,
            concurrent: false,
            retry_budget: None,
            window_end: None,
        }
    }

    /// Attaches the caller's input. On a hit the stored payload is kept, unless the
    /// conflict policy is [`OnConflict::ReplaceIfQueued`] and the task is still queued.
    pub fn with_payload(mut self, payload: serde_json::Value) -> NewTask {
        self.payload = Some(payload);
        self
    }

    /// Which of the task's states hold its key. Default [`Scope::Active`].
    pub fn scope(mut self, scope: Scope) -> NewTask {
        self.scope = scope;
        self
    }

    /// What a hit does. Default [`OnConflict::ReturnExisting`].
    pub fn on_conflict(mut self, on_conflict: OnConflict) -> NewTask {
        self.on_conflict = on_conflict;
        self
    }

    /// Not claimable before `run_at`, by the database's clock. Default: the task's
    /// creation time (the application's clock), i.e. at once.
    pub fn run_at(mut self, run_at: DateTime<Utc>) -> NewTask {
        self.run_at = Some(run_at);
        self
    }

    /// Higher is claimed first; ties go to the oldest `run_at`, then the oldest task.
    /// Default 0.
    pub fn priority(mut self, priority: i16) -> NewTask {
        self.priority = priority;
        self
    }

    /// The opt-out of one run per key. By default (`false`) a task is never claimed while
    /// another task of its key runs, whatever their scopes, and none is claimed while it
    /// runs: the database enforces it (`task_running_resource_uidx`). `true` lets this
    /// task run beside the other tasks of its key, and them beside it; dedup itself is
    /// unchanged (the scope still decides which states hold the key). For work that is
    /// safe to run twice at once and must not wait, e.g. a read-only export.
    pub fn concurrent(mut self, concurrent: bool) -> NewTask {
        self.concurrent = concurrent;
        self
    }

    /// How long `find_or_enqueue` keeps retrying on a fresh connection after its
    /// connection was lost (on a pool). Default: the handle's
    /// ([`TaskDedup::with_retry_budget`](crate::TaskDedup::with_retry_budget)), else
    /// [`DEFAULT_RETRY_BUDGET`](crate::DEFAULT_RETRY_BUDGET), 5 s. `Duration::ZERO`: no
    /// retries. In a batch, the smallest its tasks set.
    pub fn retry_budget(mut self, budget: Duration) -> NewTask {
        self.retry_budget = Some(budget);
        self
    }

    /// The task's key.
    pub fn key(&self) -> &TaskKey {
        &self.key
    }

    /// The task's payload.
    pub fn payload(&self) -> Option<&serde_json::Value> {
        self.payload.as_ref()
    }

    /// A [`Scope::Period`] task whose window ends at `window_end`, whenever it is created.
    #[cfg(feature = "worker")]
    pub(crate) fn in_window(mut self, period: Duration, window_end: i64) -> NewTask {
        self.scope = Scope::Period(period);
        self.window_end = Some(window_end);
        self
    }

    /// The `dedup_window_end` of this task created at `now`.
    pub(crate) fn window_end_at(&self, now: DateTime<Utc>) -> i64 {
        self.window_end
            .unwrap_or_else(|| self.scope.window_end(now))
    }

    /// Checks what [`TaskKey::new`] could not: the payload and the scope.
    pub(crate) fn validate(&self) -> Result<(), InvalidArgument> {
        validate::json("payload", self.payload.as_ref())?;
        self.scope.validate()
    }

    /// The row this task is inserted as, created now, with its retry budget. The key
    /// moves into the row ([`KeyParts`](crate::values::key::KeyParts) reads it there).
    pub(crate) fn into_row(self) -> (OnConflict, Option<Duration>, task_run::Model) {
        let budget = self.retry_budget;
        let (on_conflict, row) = self.into_row_at(task_run::now());
        (on_conflict, budget, row)
    }

    /// The row this task is inserted as, created at `now` (microseconds). The key's
    /// strings move into the row.
    pub(crate) fn into_row_at(self, now: DateTime<Utc>) -> (OnConflict, task_run::Model) {
        let dedup_window_end = self.window_end_at(now);
        let (user_id, task_type, resource_key) = self.key.into_parts();
        let row = task_run::Model {
            id: Uuid::now_v7(),
            user_id,
            task_type,
            resource_key,
            status: TaskStatus::Queued,
            payload: self.payload,
            result: None,
            error: None,
            attempts: 0,
            lease_owner: None,
            lease_expires_at: None,
            created_at: now,
            updated_at: now,
            started_at: None,
            finished_at: None,
            run_at: self.run_at.map_or(now, task_run::micros),
            priority: self.priority,
            scope: self.scope.stored(),
            dedup_window_end,
            concurrent: self.concurrent,
            snoozes: 0,
        };
        (self.on_conflict, row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(secs, 999_000_000).expect("valid")
    }

    #[test]
    fn period_windows_truncate_the_creation_time() {
        let hour = Scope::Period(Duration::from_secs(3_600));
        assert_eq!(hour.window_end(at(7_200)), 10_800);
        assert_eq!(hour.window_end(at(10_799)), 10_800);
        assert_eq!(hour.window_end(at(10_800)), 14_400);
        // Another period, another window, even where both start at the same instant.
        let day = Scope::Period(Duration::from_secs(86_400));
        assert_eq!(day.window_end(at(7_200)), 86_400);
        assert_eq!(Scope::Active.window_end(at(7_200)), 0);
        assert_eq!(Scope::Queued.window_end(at(7_200)), 0);
    }

    #[test]
    fn periods_are_whole_seconds() {
        for bad in [
            Duration::ZERO,
            Duration::from_millis(1_500),
            Duration::from_nanos(1),
        ] {
            assert!(Scope::Period(bad).validate().is_err(), "{bad:?}");
        }
        assert!(Scope::Period(Duration::from_secs(1)).validate().is_ok());
    }
}
