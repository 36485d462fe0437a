//! The [`Worker`] runtime. This module holds the claim loop (claim up to the free
//! slots, start each task, wait for work) and the reaper; [`run`] runs one task
//! (its handler beside a heartbeat), [`cancels`] cancels the handlers of tasks
//! cancelled from outside, [`record`] decides how to record its end,
//! [`completer`] records endings in batches, [`wake`] listens for new work, [`builder`]
//! checks the settings.

mod builder;
mod cancels;
mod completer;
#[cfg(feature = "testing")]
pub(crate) mod drain;
mod handler;
mod job;
mod outcome;
mod periodic;
mod record;
mod route;
mod run;
mod wake;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::Instrument;

pub use builder::WorkerBuilder;
pub use handler::{Handler, HandlerError};
pub use job::{Job, Lease};
pub use route::TaskHandler;
pub use wake::Wakeups;

use crate::lifecycle::TaskLifecycle;
use crate::values::backoff::RetryPolicy;
use crate::values::connection::WithRetryBudget;
use crate::values::error::DedupError;
use task_dedup_entity::task_run;

/// The runtime that runs tasks, configured through [`WorkerBuilder`]. It claims up to
/// its concurrency, runs the [`Handler`] for each under a lease it keeps alive,
/// completes or fails (with retries and backoff) what the handler returns, reaps expired
/// leases, wakes up on new work, and on shutdown hands back what it could not finish.
///
/// ```no_run
/// use std::time::Duration;
/// use task_dedup::{HandlerError, Worker};
/// use tokio_util::sync::CancellationToken;
///
/// # async fn run(db: sea_orm::DatabaseConnection) -> Result<(), task_dedup::DedupError> {
/// let shutdown = CancellationToken::new();
/// let worker = Worker::builder(db)
///     .task_types(["render-pdf"])
///     .concurrency(8)
///     .lease(Duration::from_secs(30))
///     .handler(|task: task_dedup::task_run::Model, cancel: CancellationToken| async move {
///         // ... render task.resource_key, watching `cancel` ...
///         Ok(Some(serde_json::json!({ "pages": 3 })))
///     })
///     .build()?;
/// let report = worker.run(shutdown).await?;
/// println!("{report:?}");
/// # Ok(())
/// # }
/// ```
pub struct Worker {
    db: DatabaseConnection,
    config: Arc<Config>,
    routes: Arc<route::Routes>,
    /// The schedules of its periodic tasks.
    periodic: Vec<Arc<periodic::Scheduled>>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A built worker's settings.
#[derive(Debug)]
struct Config {
    id: String,
    task_types: Vec<String>,
    /// Each type's cap in this worker (`task_type_concurrency`, else the type's options).
    type_concurrency: HashMap<String, usize>,
    /// The worker's timeout, for types without one in `timeouts`.
    timeout: Option<Duration>,
    /// Each type's timeout (`task_type_timeout`, else the type's options).
    timeouts: HashMap<String, Duration>,
    max_snoozes: u32,
    concurrency: usize,
    lease: Duration,
    heartbeat_every: Duration,
    retry: RetryPolicy,
    reap_every: Duration,
    shutdown_grace: Duration,
    cancel_grace: Duration,
    wakeups: Wakeups,
    listen_url: Option<builder::ListenUrl>,
    poll_min: Duration,
    poll_max: Duration,
    fallback_poll: Duration,
    cancel_poll: Duration,
    retry_budget: Duration,
    end_batch: usize,
    end_delay: Duration,
    retention: crate::maintenance::retention::Retention,
}

/// What a [`Worker`] did, returned when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerReport {
    /// Tasks claimed.
    pub claimed: u64,
    /// Tasks completed (`succeeded`).
    pub completed: u64,
    /// Tasks failed for good.
    pub failed: u64,
    /// Failed attempts put back in the queue for a retry.
    pub retried: u64,
    /// Handler panics among the failed or retried attempts.
    pub panicked: u64,
    /// Tasks handed back at shutdown (`release`).
    pub released: u64,
    /// Tasks whose handler snoozed them ([`HandlerError::Snooze`]): back in the queue,
    /// the attempt not counted.
    pub snoozed: u64,
    /// Attempts that ran out of their [`timeout`](WorkerBuilder::timeout) (each also
    /// counted as retried or failed).
    pub timed_out: u64,
    /// Tasks cancelled while they ran (an operator's cancel): their handlers were
    /// cancelled and their results discarded; the tasks stay cancelled.
    pub cancelled: u64,
    /// Tasks taken away otherwise while they ran (reaped after a lost lease and claimed
    /// elsewhere, deleted), or whose end could not be recorded: their handlers' results
    /// were discarded.
    pub lost: u64,
    /// Expired leases this worker's reaper requeued.
    pub reaped_requeued: u64,
    /// Expired leases this worker's reaper failed for good.
    pub reaped_failed: u64,
    /// Finished tasks this worker's pruner deleted ([`WorkerBuilder::retention`]).
    pub pruned: u64,
    /// Ticks of periodic tasks this worker enqueued (`Created`). A tick whose enqueue
    /// lost its connection after the insert committed is counted in `ticks_existing`
    /// (as `find_or_enqueue` reports it).
    pub ticks_created: u64,
    /// Ticks of periodic tasks another worker (or process) had enqueued first
    /// (`Existing`).
    pub ticks_existing: u64,
    /// Enqueues of ticks that failed (each retried while its tick is the latest).
    pub ticks_failed: u64,
    /// Ticks passed over while the worker was behind (beyond
    /// [`Schedule::catch_up`](crate::Schedule::catch_up)).
    pub ticks_skipped: u64,
    /// Checks of the PostgreSQL listener that went unheard (see [`Wakeups::Auto`]): not
    /// zero when it ran behind a transaction pooler and polled instead.
    pub unheard_listener_checks: u64,
}

/// The counters of a running worker, shared with its tasks.
#[derive(Default)]
struct Counters {
    claimed: AtomicU64,
    completed: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    panicked: AtomicU64,
    released: AtomicU64,
    snoozed: AtomicU64,
    timed_out: AtomicU64,
    cancelled: AtomicU64,
    lost: AtomicU64,
    reaped_requeued: AtomicU64,
    reaped_failed: AtomicU64,
    pruned: AtomicU64,
    ticks: periodic::TickCounters,
}

impl Counters {
    fn report(&self) -> WorkerReport {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        WorkerReport {
            claimed: get(&self.claimed),
            completed: get(&self.completed),
            failed: get(&self.failed),
            retried: get(&self.retried),
            panicked: get(&self.panicked),
            released: get(&self.released),
            snoozed: get(&self.snoozed),
            timed_out: get(&self.timed_out),
            cancelled: get(&self.cancelled),
            lost: get(&self.lost),
            reaped_requeued: get(&self.reaped_requeued),
            reaped_failed: get(&self.reaped_failed),
            pruned: get(&self.pruned),
            ticks_created: get(&self.ticks.created),
            ticks_existing: get(&self.ticks.existing),
            ticks_failed: get(&self.ticks.failed),
            ticks_skipped: get(&self.ticks.skipped),
            unheard_listener_checks: 0,
        }
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// What a running worker shares with its tasks.
struct Shared {
    db: DatabaseConnection,
    config: Arc<Config>,
    routes: Arc<route::Routes>,
    /// The worker's id, as the leases of typed tasks hold it.
    worker_id: Arc<str>,
    counters: Counters,
    /// Running tasks per limited type.
    running: Mutex<HashMap<String, usize>>,
    /// The tasks whose handlers run, for the cancel watch.
    handlers: cancels::Running,
    /// Rung when a task's handler ends (a slot, or a type's slot, is free again) and
    /// when the completer recorded a batch of endings (a follow-up of their keys may be
    /// due now).
    task_ended: Notify,
    /// Fires when the shutdown grace ran out: every handler's cancellation.
    abort: CancellationToken,
    /// When the retries this worker scheduled fall due: it claims then, whatever its
    /// poll interval.
    retries_due: Mutex<BinaryHeap<Reverse<Instant>>>,
    /// Rung when a retry is added to `retries_due`.
    retry_scheduled: Notify,
    /// Where finished tasks hand their endings to the completer.
    endings: tokio::sync::mpsc::Sender<outcome::Ending>,
}

impl Shared {
    /// The worker's pool, with the worker's retry budget.
    fn db(&self) -> WithRetryBudget<'_, DatabaseConnection> {
        WithRetryBudget::new(&self.db, self.config.retry_budget)
    }

    /// A task this worker put back in the queue (a retry, a snooze) falls due `delay`
    /// from now: claim then, whatever the poll interval. Called after the database's
    /// clock set its `run_at`, so this is no earlier than the task falls due.
    fn claim_after(&self, delay: Duration) {
        if delay.is_zero() {
            return;
        }
        self.retries_due
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Reverse(Instant::now() + delay));
        self.retry_scheduled.notify_waiters();
    }
}

impl Worker {
    /// Starts configuring a worker on `db` (a pool).
    pub fn builder(db: DatabaseConnection) -> WorkerBuilder {
        WorkerBuilder::new(db)
    }

    /// The worker's id (its `lease_owner`).
    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// Runs until `shutdown` fires, then stops claiming and enqueuing periodic ticks (an
    /// enqueue under way finishes), waits for running handlers up
    /// to the shutdown grace, cancels the ones still running (each then has the cancel
    /// grace to return before it is dropped) and hands their tasks back to the queue
    /// (`release`: no lease to wait for, the attempt not counted), records the endings
    /// still waiting in a batch, and returns what it did.
    ///
    /// Endings (completed, failed, back to the queue for a retry) are recorded in
    /// batches ([`WorkerBuilder::batch_endings`]); a task's slot is free as soon as its
    /// handler returned. Database errors while claiming or reaping are logged and
    /// retried after a pause (a database restarting does not stop the worker); a batch
    /// of endings that cannot be recorded within the retry budget is logged and its
    /// tasks counted as lost (their leases run out and the reaper takes them back).
    /// Dropping the future instead of firing `shutdown` drops the endings not recorded
    /// yet, as a crash would: their tasks come back through the reaper.
    ///
    /// # Errors
    /// None at present: the worker outlives database errors. The `Result` leaves room
    /// for start-up checks.
    #[tracing::instrument(level = "info", name = "worker", skip_all, fields(worker_id = %self.config.id))]
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerReport, DedupError> {
        let (endings, queued_endings) = completer::queue(self.config.end_batch);
        let shared = Arc::new(Shared {
            db: self.db,
            worker_id: Arc::from(self.config.id.as_str()),
            config: self.config,
            routes: self.routes,
            counters: Counters::default(),
            running: Mutex::new(HashMap::new()),
            handlers: cancels::Running::default(),
            task_ended: Notify::new(),
            abort: CancellationToken::new(),
            retries_due: Mutex::new(BinaryHeap::new()),
            retry_scheduled: Notify::new(),
            endings,
        });
        let config = &shared.config;
        tracing::info!(task_types = ?config.task_types, concurrency = config.concurrency, "worker started");
        wake::warn_about_a_single_connection(&shared.db, config.concurrency);
        let background = TaskTracker::new();
        let stop_background = CancellationToken::new();
        // Dropped with this future (a worker that dies), the reaper, the pruner and the
        // listener stop too: a dead worker's reaper went on requeueing with its policy.
        let _stop_background_on_drop = stop_background.clone().drop_guard();
        let waker = wake::Waker::start(
            &shared.db,
            config.wakeups,
            config.listen_url.as_ref().map(|url| url.0.as_str()),
            &background,
            stop_background.clone(),
        );
        background.spawn(reap(shared.clone(), stop_background.clone()));
        background.spawn(cancels::watch(
            shared.clone(),
            waker.cancels.clone(),
            waker.hears_every_cancel.clone(),
            stop_background.clone(),
        ));
        if !config.retention.is_off() {
            background.spawn(prune(shared.clone(), stop_background.clone()));
        }
        // Not in `background`: dropped with this future (a worker that dies), it records
        // nothing more, and the reaper takes the tasks back once their leases run out.
        let stop_completer = CancellationToken::new();
        let completer = AbortOnDropHandle::new(tokio::spawn(completer::run(
            shared.clone(),
            queued_endings,
            stop_completer.clone(),
        )));

        let schedulers = periodic::start(&shared, &self.periodic, &shutdown);

        let tasks = TaskTracker::new();
        let slots = Arc::new(Semaphore::new(config.concurrency));
        let mut idle = config.poll_min;
        // A claim owed after a wake-up: the notifications the sender's debounce
        // swallowed are for tasks written by then.
        let mut trailing: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            let permit = tokio::select! {
                () = shutdown.cancelled() => break,
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => break,
                },
            };
            // Registered before the claim, so that a wake-up during it is not missed.
            let task_ended = shared.task_ended.notified();
            tokio::pin!(task_ended);
            task_ended.as_mut().enable();
            let retry_scheduled = shared.retry_scheduled.notified();
            tokio::pin!(retry_scheduled);
            retry_scheduled.as_mut().enable();
            let Some((types, most)) = claimable_types(&shared) else {
                // Every type this worker runs is at its limit.
                drop(permit);
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = task_ended => {}
                }
                continue;
            };
            let bell = waker.bell.as_ref().map(|bell| bell.notified());
            tokio::pin!(bell);
            if let Some(bell) = bell.as_mut().as_pin_mut() {
                bell.enable();
            }
            // Every free slot in one claim, but under per-type caps no more than the
            // smallest room left among the capped types: a batch could be all of one.
            let mut permits = vec![permit];
            while permits.len() < most
                && let Ok(more) = slots.clone().try_acquire_owned()
            {
                permits.push(more);
            }
            if config.type_concurrency.is_empty() && permits.len() * 2 < config.concurrency {
                gather(&slots, &mut permits, config.concurrency.div_ceil(2)).await;
            }
            let types: Vec<&str> = types.iter().map(String::as_str).collect();
            let db = shared.db();
            let claim =
                crate::lifecycle::claim_many(&db, &config.id, &types, config.lease, permits.len())
                    .instrument(tracing::debug_span!("claim_many", max = permits.len()));
            // When a rate-limited type this claim found due lets a claim start tasks
            // again (its window full: the next opening, by the database's clock).
            let mut window_opens: Option<Instant> = None;
            match claim.await.map(|claimed| {
                window_opens = claimed.window_opens;
                claimed.tasks
            }) {
                Ok(claimed) if !claimed.is_empty() => {
                    idle = config.poll_min;
                    let drained = claimed.len() < permits.len();
                    let mut permits = permits.into_iter();
                    for (task, permit) in claimed.into_iter().zip(&mut permits) {
                        start(&shared, &tasks, task, permit);
                    }
                    if !drained {
                        continue;
                    }
                    // Fewer due than asked for: wait before the next claim.
                    drop(permits);
                }
                Ok(_) => drop(permits),
                Err(err) => {
                    tracing::warn!(error = %err, "claim failed; trying again after a pause");
                    idle = config.poll_max;
                    drop(permits);
                }
            }
            // Nothing to claim: wait for a wake-up, one of this worker's tasks ending, a
            // retry falling due, a rate's window opening, or the poll.
            let now = Instant::now();
            let mut wait = if waker.replaces_polling() {
                config.fallback_poll
            } else {
                idle
            };
            if let Some(at) = trailing.take().filter(|at| *at > now) {
                wait = wait.min(at - now);
            }
            if let Some(at) = next_retry_due(&shared, now) {
                wait = wait.min(at - now);
            }
            if let Some(at) = window_opens {
                wait = wait.min(at.saturating_duration_since(now).max(WINDOW_WAIT_MIN));
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {
                    idle = (idle * 2).min(config.poll_max);
                }
                () = retry_scheduled => {}
                // One of this worker's tasks ended (its end recorded): a follow-up of its
                // key may be due now, whatever the database can announce.
                () = task_ended => {}
                Some(()) = async { match bell.as_mut().as_pin_mut() {
                    Some(bell) => { bell.await; Some(()) }
                    None => None,
                } } => {
                    trailing = Some(Instant::now() + crate::executor::notify::NOTIFY_DEBOUNCE);
                }
            }
        }

        tracing::info!(running = tasks.len(), "shutting down: no more claims");
        for scheduler in schedulers {
            // Each returns as soon as it sees `shutdown`.
            if let Err(err) = scheduler.await {
                tracing::error!(error = %err, "a periodic scheduler stopped unexpectedly");
            }
        }
        tasks.close();
        if tokio::time::timeout(config.shutdown_grace, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running = tasks.len(),
                "shutdown grace over: cancelling and releasing"
            );
            shared.abort.cancel();
            tasks.wait().await;
        }
        stop_completer.cancel();
        if let Err(err) = completer.await {
            tracing::error!(error = %err, "the completer stopped unexpectedly");
        }
        stop_background.cancel();
        background.close();
        background.wait().await;
        let report = WorkerReport {
            unheard_listener_checks: waker.unheard.load(Ordering::Relaxed),
            ..shared.counters.report()
        };
        tracing::info!(?report, "worker stopped");
        Ok(report)
    }
}

/// The shortest wait for a rate's window to open: a claim that found it full again
/// (a clock a little behind) waits at least this long, never in a loop.
const WINDOW_WAIT_MIN: Duration = Duration::from_millis(1);

/// How long a claim waits for more slots to free when more than half are busy.
const CLAIM_GATHER: Duration = Duration::from_millis(1);

/// Waits up to [`CLAIM_GATHER`] for `permits` to reach `enough`: tasks that end
/// together (short handlers, whose endings no longer hold their slots) then refill
/// their slots in one claim instead of one claim each. A claim into a worker more than
/// half busy starts at most that much later.
async fn gather(slots: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>, enough: usize) {
    let _ = tokio::time::timeout(CLAIM_GATHER, async {
        while permits.len() < enough {
            match slots.clone().acquire_owned().await {
                Ok(more) => permits.push(more),
                Err(_) => return,
            }
        }
    })
    .await;
    while permits.len() < crate::values::validate::MAX_CLAIM
        && let Ok(more) = slots.clone().try_acquire_owned()
    {
        permits.push(more);
    }
}

/// The earliest retry this worker scheduled that is still to fall due, forgetting those
/// already due (the claim that just found nothing came after them).
fn next_retry_due(shared: &Shared, now: Instant) -> Option<Instant> {
    let mut due = shared
        .retries_due
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    while let Some(Reverse(at)) = due.peek() {
        if *at > now {
            return Some(*at);
        }
        due.pop();
    }
    None
}

/// The types to claim now (all of the worker's but those at their limit), and how many
/// tasks one claim may take: [`MAX_CLAIM`](crate::MAX_CLAIM), or the smallest room
/// left among the limited types claimed. `None` when every type is at its limit.
fn claimable_types(shared: &Shared) -> Option<(Vec<String>, usize)> {
    let config = &shared.config;
    if config.type_concurrency.is_empty() {
        return Some((
            config.task_types.clone(),
            crate::values::validate::MAX_CLAIM,
        ));
    }
    let running = shared
        .running
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut most = crate::values::validate::MAX_CLAIM;
    let types: Vec<String> = config
        .task_types
        .iter()
        .filter(|t| match config.type_concurrency.get(*t) {
            Some(limit) => {
                let room = limit.saturating_sub(running.get(*t).copied().unwrap_or(0));
                if room > 0 {
                    most = most.min(room);
                }
                room > 0
            }
            None => true,
        })
        .cloned()
        .collect();
    (!types.is_empty()).then_some((types, most))
}

/// Starts running `task` in `tasks`, holding `permit` until it ends.
fn start(
    shared: &Arc<Shared>,
    tasks: &TaskTracker,
    task: task_run::Model,
    permit: OwnedSemaphorePermit,
) {
    add(&shared.counters.claimed, 1);
    if shared.config.type_concurrency.contains_key(&task.task_type) {
        let mut running = shared
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *running.entry(task.task_type.clone()).or_default() += 1;
    }
    let shared = shared.clone();
    tasks.spawn(async move {
        let task_type = task.task_type.clone();
        run::run_task(&shared, task).await;
        if let Some(count) = shared
            .running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_mut(&task_type)
        {
            *count = count.saturating_sub(1);
        }
        drop(permit);
        shared.task_ended.notify_waiters();
    });
}

/// Reaps expired leases every `reap_every`, give or take a fifth, until `stop`.
async fn reap(shared: Arc<Shared>, stop: CancellationToken) {
    let config = &shared.config;
    loop {
        let jitter = 0.8 + 0.4 * rand::random::<f64>();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(config.reap_every.mul_f64(jitter)) => {}
        }
        match shared.db().reap_expired(&config.retry).await {
            Ok(report) => {
                add(&shared.counters.reaped_requeued, report.requeued);
                add(&shared.counters.reaped_failed, report.failed);
            }
            Err(err) => tracing::warn!(error = %err, "reaping failed; trying at the next interval"),
        }
    }
}

/// Prunes finished tasks every `retention.every`, give or take a fifth, until `stop`.
/// A pass under way when `stop` comes may finish within the cancel grace, so that the
/// report counts what it deleted; dropped after it (between batches or inside one), it
/// leaves every row deleted or whole.
async fn prune(shared: Arc<Shared>, stop: CancellationToken) {
    let retention = shared.config.retention;
    loop {
        let jitter = 0.8 + 0.4 * rand::random::<f64>();
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(retention.every.mul_f64(jitter)) => {}
        }
        let db = shared.db();
        let pass = db.prune(&retention);
        tokio::pin!(pass);
        let pruned = tokio::select! {
            pruned = &mut pass => pruned,
            () = stop.cancelled() => {
                match tokio::time::timeout(shared.config.cancel_grace, pass).await {
                    Ok(pruned) => pruned,
                    Err(_) => return,
                }
            }
        };
        match pruned {
            Ok(report) => add(&shared.counters.pruned, report.total()),
            Err(err) => tracing::warn!(error = %err, "pruning failed; trying at the next interval"),
        }
    }
}
