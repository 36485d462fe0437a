//! Periodic tasks without a leader ([`WorkerBuilder::periodic`](super::WorkerBuilder::periodic)).
//!
//! Every worker that declares a schedule enqueues each of its ticks, as a typed task in
//! a [`Scope::Period`](crate::Scope::Period) window pinned to `[tick, next tick)`: the
//! unique index keeps one task per tick (one process gets `Created`, the others
//! `Existing`), so no process has to be elected to do it and any of them may die. A
//! scheduler is a task of the worker's own: a timer to the next tick, the tick enqueued
//! through the worker's pool and retry budget, and after a pause (a failed enqueue, a
//! suspended process) the latest missed ticks as [`Schedule::catch_up`] says.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use super::{Shared, add};
use crate::enqueue::TaskDedup;
use crate::maintenance::schedule::{Schedule, Ticks};
use crate::metrics;
use crate::values::error::DedupError;
use crate::values::task::{NewTask, OnConflict};
use crate::values::typed::Task;
use crate::values::validate::{InvalidArgument, InvalidReason};

/// How long a scheduler waits before it enqueues again a tick that failed (after the
/// enqueue's own retries within the worker's retry budget).
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// The longest a scheduler sleeps at once: it checks the wall clock again after that,
/// so that a clock set forward (or a process that was suspended) is noticed.
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// How many skipped ticks a catch-up counts at most (for the counter and the log):
/// counting walks them one by one.
const MAX_COUNTED: u64 = 100_000;

/// Makes the task of a tick.
type MakeTask = Arc<dyn Fn(DateTime<Utc>) -> Result<NewTask, DedupError> + Send + Sync>;

/// A schedule as declared on the builder, not checked yet.
pub(super) struct Declared {
    schedule: Schedule,
    task_type: &'static str,
    make: MakeTask,
}

impl Declared {
    pub(super) fn new<T: Task>(
        schedule: Schedule,
        make: impl Fn(DateTime<Utc>) -> T + Send + Sync + 'static,
    ) -> Declared {
        Declared {
            schedule,
            task_type: T::TASK_TYPE,
            make: Arc::new(move |tick| NewTask::from_task(&make(tick))),
        }
    }

    pub(super) fn task_type(&self) -> &'static str {
        self.task_type
    }

    /// Checks the schedule, and that the worker runs the type (`task_types` empty: the
    /// untyped handler runs every type).
    pub(super) fn check(&self, task_types: &[String]) -> Result<Scheduled, DedupError> {
        let ticks = self.schedule.ticks()?;
        if !task_types.is_empty() && !task_types.iter().any(|t| t == self.task_type) {
            return Err(InvalidArgument::new(
                "periodic",
                InvalidReason::OutOfRange(
                    "a task type this worker runs: register it (or list it in task_types)",
                ),
            )
            .into());
        }
        Ok(Scheduled {
            ticks,
            task_type: self.task_type,
            make: self.make.clone(),
        })
    }
}

/// A checked schedule, ready to run.
pub(super) struct Scheduled {
    ticks: Ticks,
    task_type: &'static str,
    make: MakeTask,
}

/// The counters of a worker's schedulers, in its [`WorkerReport`](super::WorkerReport).
#[derive(Default)]
pub(super) struct TickCounters {
    pub(super) created: AtomicU64,
    pub(super) existing: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) skipped: AtomicU64,
}

/// Starts a scheduler per schedule, each stopping at `shutdown` or when its handle is
/// dropped (with the worker's future: a dropped worker enqueues nothing more).
pub(super) fn start(
    shared: &Arc<Shared>,
    scheduled: &[Arc<Scheduled>],
    shutdown: &CancellationToken,
) -> Vec<AbortOnDropHandle<()>> {
    scheduled
        .iter()
        .map(|scheduled| {
            // A child of the worker's span: its logs carry the worker's id.
            let span = tracing::info_span!(
                "periodic",
                task_type = scheduled.task_type,
                schedule = scheduled.ticks.expression()
            );
            let run = run(shared.clone(), scheduled.clone(), shutdown.clone());
            AbortOnDropHandle::new(tokio::spawn(run.instrument(span)))
        })
        .collect()
}

/// One schedule's loop: enqueue what is due, sleep until the next tick, and after a
/// pause keep the latest `max(catch_up, 1)` of the ticks passed.
async fn run(shared: Arc<Shared>, scheduled: Arc<Scheduled>, shutdown: CancellationToken) {
    let ticks = &scheduled.ticks;
    let started = Utc::now();
    tracing::info!("periodic task scheduled");
    // What was missed before the start: the `catch_up` latest ticks, the current
    // period's included (another process may have enqueued them; the index decides).
    let mut pending = latest(ticks, started, None, ticks.catch_up() as usize);
    // Every tick at or before `seen` is pending, enqueued or skipped.
    let mut seen = started;
    loop {
        while let Some(&tick) = pending.front() {
            if shutdown.is_cancelled() {
                return;
            }
            // Not cut short by `shutdown`: an enqueue that started finishes (within the
            // retry budget), so that what it did is counted.
            if enqueue(&shared, &scheduled, tick).await {
                break;
            }
            pending.pop_front();
        }
        let next = ticks.after(seen);
        let wake = match (next, pending.is_empty()) {
            (Some(next), true) => next,
            (Some(next), false) => next.min(Utc::now() + RETRY_PAUSE),
            (None, false) => Utc::now() + RETRY_PAUSE,
            (None, true) => {
                tracing::info!(
                    task_type = scheduled.task_type,
                    "the schedule has no more ticks"
                );
                return;
            }
        };
        if !sleep_until(wake, &shutdown).await {
            return;
        }
        let now = Utc::now();
        let keep = (ticks.catch_up() as usize).max(1);
        let due = latest(ticks, now, Some(seen), keep);
        let mut skipped = if due.len() == keep {
            passed(ticks, seen, due.front().copied().unwrap_or(now))
        } else {
            0
        };
        seen = now;
        pending.extend(due);
        while pending.len() > keep {
            pending.pop_front();
            skipped += 1;
        }
        if skipped > 0 {
            tracing::warn!(
                task_type = scheduled.task_type,
                skipped,
                kept = pending.len(),
                "the scheduler fell behind; enqueuing the latest ticks only"
            );
            metrics::periodic_ticks(scheduled.task_type, "skipped", skipped);
            add(&shared.counters.ticks.skipped, skipped);
        }
    }
}

/// The latest `keep` ticks at or before `now` (and after `after`), oldest first.
fn latest(
    ticks: &Ticks,
    now: DateTime<Utc>,
    after: Option<DateTime<Utc>>,
    keep: usize,
) -> VecDeque<DateTime<Utc>> {
    let mut out = VecDeque::with_capacity(keep);
    let mut at = now;
    while out.len() < keep {
        match ticks.at_or_before(at) {
            Some(tick) if after.is_none_or(|after| tick > after) => {
                out.push_front(tick);
                at = tick - chrono::Duration::seconds(1);
            }
            _ => break,
        }
    }
    out
}

/// How many ticks fall after `after` and before `until` (up to [`MAX_COUNTED`]).
fn passed(ticks: &Ticks, after: DateTime<Utc>, until: DateTime<Utc>) -> u64 {
    let mut count = 0;
    let mut at = after;
    while count < MAX_COUNTED {
        match ticks.after(at) {
            Some(tick) if tick < until => {
                count += 1;
                at = tick;
            }
            _ => break,
        }
    }
    count
}

/// Sleeps until the wall clock reads `at`; `false` if `shutdown` fired first.
async fn sleep_until(at: DateTime<Utc>, shutdown: &CancellationToken) -> bool {
    loop {
        let Ok(left) = (at - Utc::now()).to_std() else {
            return true;
        };
        if left.is_zero() {
            return true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep(left.min(MAX_SLEEP)) => {}
        }
    }
}

/// Enqueues the task of `tick`, counts and logs the outcome; `true` when it failed and
/// is worth trying again (a database error), `false` when it is done with (enqueued,
/// found, or a task that cannot be made: an invalid key or payload is logged and the
/// tick skipped).
#[tracing::instrument(
    level = "debug",
    name = "periodic_tick",
    skip_all,
    fields(task_type = scheduled.task_type, tick = %tick, outcome)
)]
async fn enqueue(shared: &Shared, scheduled: &Scheduled, tick: DateTime<Utc>) -> bool {
    let counters = &shared.counters.ticks;
    let (outcome, counter, retry) = match enqueue_tick(shared, scheduled, tick).await {
        Ok(true) => ("created", &counters.created, false),
        Ok(false) => ("existing", &counters.existing, false),
        Err(err) => {
            let retry = !matches!(
                err,
                DedupError::InvalidKey { .. }
                    | DedupError::InvalidArgument { .. }
                    | DedupError::Encode { .. }
            );
            tracing::warn!(
                task_type = scheduled.task_type,
                %tick,
                error = %err,
                retry,
                "enqueuing a periodic task failed"
            );
            ("failed", &counters.failed, retry)
        }
    };
    tracing::Span::current().record("outcome", outcome);
    metrics::periodic_ticks(scheduled.task_type, outcome, 1);
    add(counter, 1);
    retry
}

/// The tick's task, enqueued: scheduled at the tick, in the window `[tick, next tick)`
/// (to the end of time for a schedule's last tick), returning the task already there.
/// `true` when this call created it.
async fn enqueue_tick(
    shared: &Shared,
    scheduled: &Scheduled,
    tick: DateTime<Utc>,
) -> Result<bool, DedupError> {
    let window_end = scheduled
        .ticks
        .after(tick)
        .map_or(i64::MAX, |next| next.timestamp());
    let period = u64::try_from(window_end.saturating_sub(tick.timestamp())).unwrap_or(1);
    let task = (scheduled.make)(tick)?
        .in_window(Duration::from_secs(period.max(1)), window_end)
        .on_conflict(OnConflict::ReturnExisting)
        .run_at(tick);
    Ok(shared.db().find_or_enqueue(task).await?.is_created())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("an RFC 3339 time")
            .with_timezone(&Utc)
    }

    #[test]
    fn catch_up_takes_the_latest_ticks_oldest_first() {
        let ticks = Schedule::every(Duration::from_secs(60))
            .ticks()
            .expect("valid");
        let now = at("2026-12-02T10:03:30Z");
        assert!(latest(&ticks, now, None, 0).is_empty());
        assert_eq!(latest(&ticks, now, None, 1), [at("2026-12-02T10:03:00Z")]);
        assert_eq!(
            latest(&ticks, now, None, 3),
            [
                at("2026-12-02T10:01:00Z"),
                at("2026-12-02T10:02:00Z"),
                at("2026-12-02T10:03:00Z"),
            ]
        );
        // A tick exactly now is past; ticks at or before `after` were seen already.
        assert_eq!(
            latest(
                &ticks,
                at("2026-12-02T10:03:00Z"),
                Some(at("2026-12-02T10:01:00Z")),
                5
            ),
            [at("2026-12-02T10:02:00Z"), at("2026-12-02T10:03:00Z")]
        );
        // Passed over: between the last seen and the first kept (09:01 to 10:02).
        assert_eq!(
            passed(
                &ticks,
                at("2026-12-02T09:00:30Z"),
                at("2026-12-02T10:03:00Z")
            ),
            62
        );
    }
}
