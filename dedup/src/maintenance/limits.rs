//! Limits per task type, stored in the database (`task_dedup_limits`, migration 11),
//! behind [`TaskAdmin::set_limits`](crate::TaskAdmin::set_limits), `clear_limits` and
//! `limits`: how many tasks of a type run at once anywhere, how many per user, and how
//! many start per window; and behind `set_user_limit`, `clear_user_limit` and
//! `user_limit`, how many tasks of one user run at once across all types (the row of
//! the empty type, [`ALL_TYPES`], which no task has: no schema change). The claims
//! enforce them ([`crate::lifecycle`]), so every
//! worker of every process agrees, from its next claim on. Which types are limited is
//! read once a second per database and process ([`limited_types`]), and afresh after
//! this process changed them.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::connect::retry::Retrying;
use crate::dialect::limits::ALL_TYPES;
use crate::dialect::{Dialect, Failure};
use crate::executor::Executor;
use crate::executor::limits::{LimitRow, ListedLimit};
use crate::values::connection::DedupConnection;
use crate::values::error::DedupError;
use crate::values::validate::{self, InvalidArgument};
use task_dedup_entity::task_run::TASK_TYPE_MAX_CHARS;

/// The largest count a limit takes (tasks running, starts per window).
pub const MAX_LIMIT: u32 = 1_000_000;

/// The shortest and the longest window of a [`RateLimit`].
pub const RATE_WINDOWS: (Duration, Duration) = (
    Duration::from_millis(1),
    Duration::from_secs(31 * 24 * 3600),
);

/// The limits of one task type, for [`TaskAdmin::set_limits`](crate::TaskAdmin::set_limits).
/// Each is off unless set; a claim starts a task of the type only while every one that
/// is set allows it. Tasks over a limit stay queued, their attempts not counted.
///
/// ```
/// use std::time::Duration;
/// use task_dedup::TypeLimits;
///
/// // At most 2 exports running anywhere, 1 per user, 60 started a minute, users
/// // served in turn.
/// let limits = TypeLimits::new()
///     .max_running(2)
///     .max_running_per_user(1)
///     .rate(60, Duration::from_secs(60))
///     .fair_between_users();
/// assert!(limits.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TypeLimits {
    /// At most this many tasks of the type running at once, across every worker.
    pub max_running: Option<u32>,
    /// At most this many tasks of the type running at once per `user_id`.
    pub max_running_per_user: Option<u32>,
    /// At most so many starts of the type per window, across every worker; a Worker
    /// that finds the window full wakes when the next one opens ([`RateLimit`]).
    pub rate: Option<RateLimit>,
    /// Claims take users in turn: each claim of the type starts with the user after
    /// the last one served, one task per user with queued work before a second of any,
    /// so a user with a long backlog delays another user's task by one turn at most.
    /// Off: the type's tasks start in claim order (priority, then `run_at`), whoever
    /// they belong to.
    pub fair: bool,
}

/// At most `starts` claims of a type per fixed window of `per`, the windows aligned on
/// the Unix epoch by the database's clock. A task over the limit waits in the queue for
/// the next window; its attempt is not counted.
///
/// A start counts in the window its `started_at` falls in, as the database stamps it, so
/// no epoch-aligned window of stored `started_at` values holds more than `starts`.
///
/// How a [`Worker`](crate::Worker) waits for the window: when its claim finds tasks of
/// the type due and the window full, it claims again when the next window opens, as
/// the database's clock and the window's start and length in the limit row compute it
/// (not by the worker's clock), instead of waiting for its poll or a notification:
/// never sooner than 1 ms, never later than its poll. The workers that wake at one
/// opening race for it under the type's lock; those that find it full again wait for
/// the next one. A claim that fails (a lost connection) waits for the poll as any
/// failed claim does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimit {
    /// Starts allowed per window.
    pub starts: u32,
    /// The window.
    pub per: Duration,
}

impl TypeLimits {
    /// No limit set.
    pub fn new() -> TypeLimits {
        TypeLimits::default()
    }

    /// At most `n` tasks of the type running at once, across every worker.
    #[must_use]
    pub fn max_running(mut self, n: u32) -> TypeLimits {
        self.max_running = Some(n);
        self
    }

    /// At most `n` tasks of the type running at once per `user_id`.
    #[must_use]
    pub fn max_running_per_user(mut self, n: u32) -> TypeLimits {
        self.max_running_per_user = Some(n);
        self
    }

    /// At most `starts` starts of the type per window of `per` ([`RateLimit`]: the
    /// windows, and how a Worker waits for the next one).
    #[must_use]
    pub fn rate(mut self, starts: u32, per: Duration) -> TypeLimits {
        self.rate = Some(RateLimit { starts, per });
        self
    }

    /// Claims of the type take users in turn ([`fair`](Self::fair)).
    #[must_use]
    pub fn fair_between_users(mut self) -> TypeLimits {
        self.fair = true;
        self
    }

    /// Checks the limits as [`set_limits`](crate::TaskAdmin::set_limits) does before any
    /// SQL runs.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] when nothing is set, a count is 0 or over
    /// [`MAX_LIMIT`], or a window is outside [`RATE_WINDOWS`].
    pub fn validate(&self) -> Result<(), DedupError> {
        self.columns().map(|_| ()).map_err(DedupError::from)
    }

    /// The row's columns: max_running, max_running_per_user, rate_starts,
    /// rate_window_micros.
    fn columns(&self) -> Result<[Option<i64>; 4], InvalidArgument> {
        let count = |name: &'static str, n: Option<u32>| match n {
            Some(n) if n == 0 || n > MAX_LIMIT => Err(InvalidArgument::out_of_range(
                name,
                "a count from 1 to MAX_LIMIT (1,000,000)",
            )),
            n => Ok(n.map(i64::from)),
        };
        if self.max_running.is_none()
            && self.max_running_per_user.is_none()
            && self.rate.is_none()
            && !self.fair
        {
            return Err(InvalidArgument::out_of_range(
                "limits",
                "at least one limit or fairness (clear_limits removes them all)",
            ));
        }
        let max_running = count("max_running", self.max_running)?;
        let per_user = count("max_running_per_user", self.max_running_per_user)?;
        let (starts, window) = match self.rate {
            None => (None, None),
            Some(rate) => {
                if rate.per < RATE_WINDOWS.0 || rate.per > RATE_WINDOWS.1 {
                    return Err(InvalidArgument::out_of_range(
                        "rate.per",
                        "a window from 1 ms to 31 days",
                    ));
                }
                let window = validate::micros("rate.per", rate.per)?;
                (count("rate.starts", Some(rate.starts))?, Some(window))
            }
        };
        Ok([max_running, per_user, starts, window])
    }

    /// The limits a stored row holds.
    fn of(row: &LimitRow) -> TypeLimits {
        let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok());
        TypeLimits {
            max_running: count(row.max_running),
            max_running_per_user: count(row.max_running_per_user),
            rate: match (count(row.rate_starts), row.rate_window_micros) {
                (Some(starts), Some(micros)) => Some(RateLimit {
                    starts,
                    per: Duration::from_micros(u64::try_from(micros).unwrap_or(0)),
                }),
                _ => None,
            },
            fair: row.fair,
        }
    }
}

/// A limited task type, as [`TaskAdmin::limits`](crate::TaskAdmin::limits) lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitedType {
    /// The task type.
    pub task_type: String,
    /// Its limits.
    pub limits: TypeLimits,
    /// Its tasks running now (the slots of `max_running` in use).
    pub running: u64,
    /// Its starts in the rate's current window (0 without a rate).
    pub starts_in_window: u64,
    /// When its limits were last set, by the database's clock.
    pub updated_at: DateTime<Utc>,
}

/// The limit on each user's running tasks across all types, as
/// [`TaskAdmin::user_limit`](crate::TaskAdmin::user_limit) reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UserLimit {
    /// At most this many tasks of one user running at once, of all types together.
    pub max_running: u32,
    /// The users with a task running now.
    pub users_running: u64,
    /// The users at the limit now: their other due tasks wait.
    pub users_at_limit: u64,
    /// The most tasks one user runs now (above the limit when it was lowered while they
    /// ran).
    pub busiest: u64,
    /// When the limit was last set, by the database's clock.
    pub updated_at: DateTime<Utc>,
}

/// The rate window a claim counts in, and the starts counted in it: the window the
/// database's clock (`now_micros`) falls in, or the one the row records if that is later.
/// A later recorded window means that another claim counted there after this one read
/// the clock (PostgreSQL's and MySQL's clock is the statement's start, before its wait
/// for the type's lock): counting in the clock's older window would start the limit
/// again in the recorded one.
pub(crate) fn window(row: &LimitRow) -> Option<(i64, i64)> {
    let length = row.rate_window_micros.filter(|w| *w > 0)?;
    let start = row.now_micros.div_euclid(length) * length;
    if row.window_start_micros >= start {
        Some((row.window_start_micros, i64::from(row.window_starts)))
    } else {
        Some((start, 0))
    }
}

/// The window to record after a claim of `window` (as [`window`] gave it) started `n`
/// tasks stamped `stamped` (their `started_at` in microseconds, by the database's
/// clock, read in a later statement than the limits): the window the stamps fall in,
/// with `n` starts when that is a later one than the claim counted in (the claim read
/// the clock at the end of one window and stamped its tasks in the next, which no start
/// had reached: it holds the type's lock), else the window counted in, with `n` more.
pub(crate) fn counted(window: (i64, i64), length: i64, stamped: Option<i64>, n: i64) -> (i64, i64) {
    let (start, starts) = window;
    match stamped.map(|at| at.div_euclid(length) * length) {
        Some(later) if length > 0 && later > start => (later, n),
        _ => (start, starts + n),
    }
}

/// How long this process trusts its list of limited types.
const REFRESH: Duration = Duration::from_secs(1);

type Database = (Dialect, u64);

/// When this process last read a database's limited types, and what it read.
type Read = (Instant, Arc<[String]>);

static KNOWN: LazyLock<Mutex<HashMap<Database, Read>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn known() -> MutexGuard<'static, HashMap<Database, Read>> {
    KNOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The limited task types of `exec`'s database (read afresh in a caller's transaction,
/// which does not say which database it is on).
pub(crate) async fn limited_types(exec: &mut Executor<'_>) -> Result<Arc<[String]>, Failure> {
    let database = exec.database_identity().map(|id| (exec.dialect(), id));
    if let Some(database) = database
        && let Some((read, types)) = known().get(&database)
        && read.elapsed() < REFRESH
    {
        return Ok(Arc::clone(types));
    }
    // Boxed: once a second, and its state would otherwise sit in every claim's future.
    let types: Arc<[String]> = Box::pin(exec.limited_types()).await?.into();
    if let Some(database) = database {
        known().insert(database, (Instant::now(), Arc::clone(&types)));
    }
    Ok(types)
}

/// This process changed the limits of `exec`'s database: read them afresh.
fn forget(exec: &Executor<'_>) {
    if let Some(id) = exec.database_identity() {
        known().remove(&(exec.dialect(), id));
    }
}

fn task_type_arg(task_type: &str) -> Result<(), InvalidArgument> {
    validate::text(task_type, TASK_TYPE_MAX_CHARS)
        .map_err(|reason| InvalidArgument::new("task_type", reason))
}

/// Sets `task_type`'s limits, replacing any it had. Wakes the workers that wait for
/// notifications (a raised limit may leave room for its tasks).
pub(crate) async fn set<C: DedupConnection + ?Sized>(
    db: &C,
    task_type: &str,
    limits: &TypeLimits,
) -> Result<(), DedupError> {
    task_type_arg(task_type)?;
    let columns = limits.columns()?;
    store(db, task_type, columns, limits.fair).await?;
    tracing::info!(task_type, ?limits, "task type limits set");
    Ok(())
}

/// Sets the limit across all types: at most `max_running` running tasks per user.
pub(crate) async fn set_user_limit<C: DedupConnection + ?Sized>(
    db: &C,
    max_running: u32,
) -> Result<(), DedupError> {
    let limits = TypeLimits::new().max_running_per_user(max_running);
    let columns = limits
        .columns()
        .map_err(|_| InvalidArgument::out_of_range("max_running", "1 to MAX_LIMIT (1,000,000)"))?;
    store(db, ALL_TYPES, columns, false).await?;
    tracing::info!(max_running, "limit across all types set");
    Ok(())
}

/// Stores the row of `task_type` (checked), then wakes the workers.
async fn store<C: DedupConnection + ?Sized>(
    db: &C,
    task_type: &str,
    columns: [Option<i64>; 4],
    fair: bool,
) -> Result<(), DedupError> {
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, None, "set_limits");
    loop {
        let attempt =
            async { Ok::<_, DedupError>(exec.set_limits(task_type, columns, fair).await?) };
        // Boxed, as in the lifecycle's `retried`.
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            break outcome?;
        }
    }
    forget(&exec);
    crate::executor::notify::task_due(&mut exec).await?;
    Ok(())
}

/// Removes `task_type`'s limits; whether it had any.
pub(crate) async fn clear<C: DedupConnection + ?Sized>(
    db: &C,
    task_type: &str,
) -> Result<bool, DedupError> {
    task_type_arg(task_type)?;
    remove(db, task_type).await
}

/// Removes the limit across all types; whether there was one.
pub(crate) async fn clear_user_limit<C: DedupConnection + ?Sized>(
    db: &C,
) -> Result<bool, DedupError> {
    remove(db, ALL_TYPES).await
}

/// Removes the row of `task_type` (checked); whether there was one. Wakes the workers
/// when there was.
async fn remove<C: DedupConnection + ?Sized>(db: &C, task_type: &str) -> Result<bool, DedupError> {
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, None, "clear_limits");
    let cleared = loop {
        let attempt = async { Ok::<_, DedupError>(exec.clear_limits(task_type).await?) };
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            break outcome?;
        }
    };
    forget(&exec);
    if cleared {
        tracing::info!(
            task_type,
            "limits cleared (the empty type: across all types)"
        );
        crate::executor::notify::task_due(&mut exec).await?;
    }
    Ok(cleared)
}

/// Every stored row of limits, read through the retry driver.
async fn rows<C: DedupConnection + ?Sized>(
    db: &C,
    exec: &mut Executor<'_>,
) -> Result<Vec<ListedLimit>, DedupError> {
    let mut retrying = Retrying::new(db, None, "limits");
    loop {
        let attempt = async { Ok::<_, DedupError>(exec.list_limits().await?) };
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            return outcome;
        }
    }
}

/// Every limited type, by name.
pub(crate) async fn list<C: DedupConnection + ?Sized>(
    db: &C,
) -> Result<Vec<LimitedType>, DedupError> {
    let mut exec = Executor::on(db)?;
    Ok(rows(db, &mut exec)
        .await?
        .into_iter()
        .filter(|listed| listed.task_type != ALL_TYPES)
        .map(|listed| LimitedType {
            limits: TypeLimits::of(&listed.limits),
            running: u64::try_from(listed.running).unwrap_or(0),
            starts_in_window: window(&listed.limits)
                .and_then(|(_, starts)| u64::try_from(starts).ok())
                .unwrap_or(0),
            task_type: listed.task_type,
            updated_at: listed.updated_at,
        })
        .collect())
}

/// The limit across all types, with each user's running tasks now; `None` when none
/// is set.
pub(crate) async fn user_limit<C: DedupConnection + ?Sized>(
    db: &C,
) -> Result<Option<UserLimit>, DedupError> {
    let mut exec = Executor::on(db)?;
    let Some(row) = rows(db, &mut exec)
        .await?
        .into_iter()
        .find(|listed| listed.task_type == ALL_TYPES)
    else {
        return Ok(None);
    };
    let Some(max_running) = TypeLimits::of(&row.limits).max_running_per_user else {
        return Ok(None);
    };
    let mut retrying = Retrying::new(db, None, "user_limit");
    let users = loop {
        let attempt = async { Ok::<_, DedupError>(exec.running_users().await?) };
        if let Some(outcome) = retrying.run(Box::pin(attempt)).await {
            break outcome?;
        }
    };
    let mut running: HashMap<String, u64> = HashMap::new();
    for user in users {
        *running.entry(user).or_default() += 1;
    }
    Ok(Some(UserLimit {
        max_running,
        users_running: running.len() as u64,
        users_at_limit: running
            .values()
            .filter(|n| **n >= u64::from(max_running))
            .count() as u64,
        busiest: running.values().copied().max().unwrap_or(0),
        updated_at: row.updated_at,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(now: i64, window: i64, start: i64, starts: i32) -> LimitRow {
        LimitRow {
            max_running: None,
            max_running_per_user: None,
            rate_starts: Some(5),
            rate_window_micros: Some(window),
            window_start_micros: start,
            window_starts: starts,
            fair: false,
            fair_cursor: None,
            now_micros: now,
        }
    }

    #[test]
    fn windows_align_on_the_epoch_and_restart_their_count() {
        assert_eq!(window(&row(1_500, 1_000, 1_000, 3)), Some((1_000, 3)));
        assert_eq!(window(&row(2_000, 1_000, 1_000, 3)), Some((2_000, 0)));
        assert_eq!(window(&row(999, 1_000, 0, 4)), Some((0, 4)));
        // A clock read before another claim recorded the next window: that one counts.
        assert_eq!(window(&row(1_999, 1_000, 2_000, 4)), Some((2_000, 4)));
    }

    #[test]
    fn starts_count_in_the_window_their_stamps_fall_in() {
        // Stamped in the window counted: added to its count.
        assert_eq!(counted((1_000, 3), 1_000, Some(1_999), 1), (1_000, 4));
        // Counted at the end of one window, stamped in the next: the next holds them.
        assert_eq!(counted((1_000, 0), 1_000, Some(2_000), 4), (2_000, 4));
        // Nothing stamped (nothing started), or a stamp behind the window counted.
        assert_eq!(counted((1_000, 2), 1_000, None, 0), (1_000, 2));
        assert_eq!(counted((2_000, 2), 1_000, Some(1_500), 1), (2_000, 3));
    }

    #[test]
    fn limits_are_checked_before_any_sql() {
        assert!(TypeLimits::new().validate().is_err());
        assert!(TypeLimits::new().fair_between_users().validate().is_ok());
        assert!(TypeLimits::new().max_running(0).validate().is_err());
        assert!(
            TypeLimits::new()
                .max_running_per_user(MAX_LIMIT + 1)
                .validate()
                .is_err()
        );
        assert!(
            TypeLimits::new()
                .rate(1, Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(
            TypeLimits::new()
                .rate(0, Duration::from_secs(1))
                .validate()
                .is_err()
        );
        let limits = TypeLimits::new()
            .max_running(3)
            .rate(10, Duration::from_secs(1));
        assert_eq!(
            limits.columns().ok(),
            Some([Some(3), None, Some(10), Some(1_000_000)])
        );
    }
}
