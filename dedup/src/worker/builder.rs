//! [`WorkerBuilder`]: a [`Worker`]'s configuration, with defaults and validation.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;

use super::handler::Handler;
use super::periodic::Declared;
use super::route::{Route, Routes, TaskHandler, TypeRoute, Typed, Untyped};
use super::{Wakeups, Worker};
use crate::maintenance::retention::Retention;
use crate::maintenance::schedule::Schedule;
use crate::values::backoff::RetryPolicy;
use crate::values::connection::DEFAULT_RETRY_BUDGET;
use crate::values::error::DedupError;
use crate::values::typed::{Task, TaskOptions};
use crate::values::validate::{self, InvalidArgument, InvalidReason};
use task_dedup_entity::task_run;

/// [`WorkerBuilder::max_snoozes`]'s default.
const DEFAULT_MAX_SNOOZES: u32 = 100;

/// Builds a [`Worker`]: `Worker::builder(db)`, then the settings, then
/// [`build`](Self::build). Every setting but the handler has a default.
#[must_use]
pub struct WorkerBuilder {
    pub(super) db: DatabaseConnection,
    pub(super) id: Option<String>,
    pub(super) task_types: Vec<String>,
    pub(super) type_concurrency: HashMap<String, usize>,
    pub(super) timeout: Option<Duration>,
    pub(super) timeouts: HashMap<String, Duration>,
    pub(super) max_snoozes: u32,
    pub(super) concurrency: usize,
    pub(super) lease: Duration,
    pub(super) heartbeat_every: Option<Duration>,
    pub(super) retry: RetryPolicy,
    pub(super) reap_every: Option<Duration>,
    pub(super) shutdown_grace: Duration,
    pub(super) cancel_grace: Duration,
    pub(super) wakeups: Wakeups,
    pub(super) listen_url: Option<ListenUrl>,
    pub(super) poll_min: Duration,
    pub(super) poll_max: Duration,
    pub(super) fallback_poll: Duration,
    pub(super) cancel_poll: Duration,
    pub(super) retry_budget: Duration,
    pub(super) end_batch: usize,
    pub(super) end_delay: Duration,
    pub(super) retention: Retention,
    pub(super) handler: Option<Arc<dyn Handler>>,
    pub(super) registered: Vec<Registration>,
    pub(super) periodic: Vec<Declared>,
}

/// A type registered with [`WorkerBuilder::register`].
pub(super) struct Registration {
    task_type: &'static str,
    route: Arc<dyn Route>,
    options: TaskOptions,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("id", &self.id)
            .field("task_types", &self.task_types)
            .field("type_concurrency", &self.type_concurrency)
            .field("timeout", &self.timeout)
            .field("timeouts", &self.timeouts)
            .field("max_snoozes", &self.max_snoozes)
            .field("concurrency", &self.concurrency)
            .field("lease", &self.lease)
            .field("heartbeat_every", &self.heartbeat_every)
            .field("retry", &self.retry)
            .field("reap_every", &self.reap_every)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("cancel_grace", &self.cancel_grace)
            .field("wakeups", &self.wakeups)
            .field("listen_url", &self.listen_url)
            .field("poll_min", &self.poll_min)
            .field("poll_max", &self.poll_max)
            .field("fallback_poll", &self.fallback_poll)
            .field("cancel_poll", &self.cancel_poll)
            .field("retry_budget", &self.retry_budget)
            .field("end_batch", &self.end_batch)
            .field("end_delay", &self.end_delay)
            .field("retention", &self.retention)
            .field("handler", &self.handler.as_ref().map(|_| "..."))
            .field(
                "registered",
                &self
                    .registered
                    .iter()
                    .map(|r| r.task_type)
                    .collect::<Vec<_>>(),
            )
            .field(
                "periodic",
                &self
                    .periodic
                    .iter()
                    .map(Declared::task_type)
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    pub(super) fn new(db: DatabaseConnection) -> WorkerBuilder {
        WorkerBuilder {
            db,
            id: None,
            task_types: Vec::new(),
            type_concurrency: HashMap::new(),
            timeout: None,
            timeouts: HashMap::new(),
            max_snoozes: DEFAULT_MAX_SNOOZES,
            concurrency: 8,
            lease: Duration::from_secs(30),
            heartbeat_every: None,
            retry: RetryPolicy::default(),
            reap_every: None,
            shutdown_grace: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
            wakeups: Wakeups::Auto,
            listen_url: None,
            poll_min: Duration::from_millis(50),
            poll_max: Duration::from_secs(2),
            fallback_poll: Duration::from_secs(5),
            cancel_poll: Duration::from_secs(1),
            retry_budget: DEFAULT_RETRY_BUDGET,
            end_batch: 100,
            end_delay: Duration::from_millis(5),
            retention: Retention::default(),
            handler: None,
            registered: Vec::new(),
            periodic: Vec::new(),
        }
    }

    /// The worker's id, recorded as `lease_owner` (at most 64 characters). Default:
    /// `task-dedup-<process id>-<random>`, unique per worker.
    pub fn id(mut self, id: impl Into<String>) -> WorkerBuilder {
        self.id = Some(id.into());
        self
    }

    /// The task types this worker runs. Default: every type.
    pub fn task_types<I, S>(mut self, task_types: I) -> WorkerBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.task_types = task_types.into_iter().map(Into::into).collect();
        self
    }

    /// At most `concurrency` tasks of `task_type` at a time in this worker (within the
    /// overall [`concurrency`](Self::concurrency)); the typed equivalent is
    /// [`TaskOptions::concurrency`](crate::TaskOptions::concurrency). The type must be one
    /// of [`task_types`](Self::task_types). A cap of this process alone: limits across
    /// every worker are the database's
    /// ([`TaskAdmin::set_limits`](crate::TaskAdmin::set_limits)).
    pub fn task_type_concurrency(
        mut self,
        task_type: impl Into<String>,
        concurrency: usize,
    ) -> WorkerBuilder {
        self.type_concurrency.insert(task_type.into(), concurrency);
        self
    }

    /// The old name of [`task_type_concurrency`](Self::task_type_concurrency) (0.1).
    #[deprecated(
        since = "0.2.0",
        note = "renamed `task_type_concurrency`: database-enforced limits are `TaskAdmin::set_limits`"
    )]
    pub fn task_type_limit(self, task_type: impl Into<String>, limit: usize) -> WorkerBuilder {
        self.task_type_concurrency(task_type, limit)
    }

    /// How long a handler may run, for every type without a timeout of its own
    /// ([`task_type_timeout`](Self::task_type_timeout), [`TaskOptions::timeout`]). At the
    /// deadline the handler's `cancel` token fires; a handler still running after the
    /// [`cancel_grace`](Self::cancel_grace) is dropped at its next `.await`. The attempt
    /// is then a failed one (`error`: "timed out after ..."), retried as the type's retry
    /// policy says. A handler that returns success within the grace keeps it: the work
    /// was done. The lease is renewed as usual until then, so a timeout may be longer
    /// than the lease. Default: none (a handler runs as long as it takes).
    ///
    /// [`TaskOptions::timeout`]: crate::TaskOptions::timeout
    pub fn timeout(mut self, timeout: Duration) -> WorkerBuilder {
        self.timeout = Some(timeout);
        self
    }

    /// The [`timeout`](Self::timeout) of `task_type`'s handler, over the type's
    /// [`TaskOptions::timeout`](crate::TaskOptions::timeout) and the worker's. The type
    /// must be one the worker runs.
    pub fn task_type_timeout(
        mut self,
        task_type: impl Into<String>,
        timeout: Duration,
    ) -> WorkerBuilder {
        self.timeouts.insert(task_type.into(), timeout);
        self
    }

    /// How many times a task may snooze ([`HandlerError::Snooze`]): a snooze beyond it
    /// fails the task for good ("snoozed N times ..."), so that a handler that always
    /// snoozes does not keep its key for ever. Counted in the task's `snoozes`, across
    /// workers and restarts. Default 100.
    ///
    /// [`HandlerError::Snooze`]: super::HandlerError::Snooze
    pub fn max_snoozes(mut self, max: u32) -> WorkerBuilder {
        self.max_snoozes = max;
        self
    }

    /// How many tasks run at a time. Default 8.
    pub fn concurrency(mut self, concurrency: usize) -> WorkerBuilder {
        self.concurrency = concurrency;
        self
    }

    /// The lease a claim takes and each heartbeat renews. Default 30 s.
    pub fn lease(mut self, lease: Duration) -> WorkerBuilder {
        self.lease = lease;
        self
    }

    /// How often a running task's lease is renewed; also how soon a handler learns that
    /// its task was cancelled or taken over. Default: a third of the lease.
    pub fn heartbeat_every(mut self, every: Duration) -> WorkerBuilder {
        self.heartbeat_every = Some(every);
        self
    }

    /// Retries of failed attempts (handler errors and panics, and the reaper's requeues
    /// of expired leases). Default [`RetryPolicy::default`].
    pub fn retry_policy(mut self, policy: RetryPolicy) -> WorkerBuilder {
        self.retry = policy;
        self
    }

    /// How often this worker reaps expired leases (give or take a fifth, so that many
    /// workers do not reap at once; each task is reaped once whoever does). Default: the
    /// lease.
    pub fn reap_every(mut self, every: Duration) -> WorkerBuilder {
        self.reap_every = Some(every);
        self
    }

    /// How long a shutdown waits for running handlers before it cancels them (each then
    /// has the [`cancel_grace`](Self::cancel_grace) to return) and hands their tasks back
    /// to the queue. Default 30 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> WorkerBuilder {
        self.shutdown_grace = grace;
        self
    }

    /// How long a handler whose cancellation fired (its task was taken away, or the
    /// shutdown grace ran out) may take to return before it is dropped at its next
    /// `.await`. A handler that listens to its `cancel` token returns long before;
    /// this bounds one that does not. Default 5 s.
    pub fn cancel_grace(mut self, grace: Duration) -> WorkerBuilder {
        self.cancel_grace = grace;
        self
    }

    /// How the worker learns of new tasks. Default [`Wakeups::Auto`].
    pub fn wakeups(mut self, wakeups: Wakeups) -> WorkerBuilder {
        self.wakeups = wakeups;
        self
    }

    /// PostgreSQL: the URL the wake-up listener connects to, on a connection of its
    /// own, instead of taking one from the worker's pool. For a pool through a
    /// transaction pooler (PgBouncer in `pool_mode = transaction`, RDS Proxy, ...),
    /// where LISTEN does not hold: give the listener a direct URL (or one through a
    /// session-mode pooler), and the claims, heartbeats and endings still go through
    /// the pool. Without it, such a worker finds its listener deaf and polls
    /// ([`Wakeups::Auto`]). Unused with [`Wakeups::Poll`].
    pub fn listen_url(mut self, url: impl Into<String>) -> WorkerBuilder {
        self.listen_url = Some(ListenUrl(url.into()));
        self
    }

    /// The adaptive poll (MySQL/MariaDB, SQLite, and [`Wakeups::Poll`]): after a claim
    /// finds nothing the worker waits `min`, doubling up to `max` while nothing comes.
    /// Default 50 ms and 2 s.
    pub fn poll_interval(mut self, min: Duration, max: Duration) -> WorkerBuilder {
        self.poll_min = min;
        self.poll_max = max;
        self
    }

    /// With PostgreSQL notifications ([`Wakeups::Auto`]): how long the worker waits for
    /// one before it claims anyway. This is how late, at worst, it starts a scheduled
    /// task (`run_at` in the future) or another worker's retry when it falls due; its
    /// own retries it claims on time. Default 5 s.
    pub fn fallback_poll(mut self, every: Duration) -> WorkerBuilder {
        self.fallback_poll = every;
        self
    }

    /// How often the worker looks up the tasks it runs, to cancel the handlers of those
    /// cancelled (or taken away) meanwhile, where nothing announces a cancel: on
    /// MySQL/MariaDB, on SQLite for a cancel from another process or inside a caller's
    /// transaction, and on PostgreSQL while its listener is down. Where the listener or
    /// the SQLite bell hears cancels, it looks at
    /// [`fallback_poll`](Self::fallback_poll) instead, if that is longer. Only while
    /// tasks run: one `SELECT` of their ids. Default 1 s.
    pub fn cancel_poll(mut self, every: Duration) -> WorkerBuilder {
        self.cancel_poll = every;
        self
    }

    /// How long the worker's claims, heartbeats and task endings keep retrying on a
    /// fresh connection after theirs was lost. Default
    /// [`DEFAULT_RETRY_BUDGET`](crate::DEFAULT_RETRY_BUDGET), 5 s.
    pub fn retry_budget(mut self, budget: Duration) -> WorkerBuilder {
        self.retry_budget = budget;
        self
    }

    /// How the endings of tasks (completed, failed, back to the queue for a retry) are
    /// recorded: in batches of at most `max_size` (1 to
    /// [`MAX_END_BATCH`](crate::MAX_END_BATCH)), one statement per batch and kind of
    /// ending, each batch recorded once it is full or its first ending has waited
    /// `max_delay`, and at shutdown. Default 100 and 5 ms.
    ///
    /// A task's slot is free as soon as its handler returns, so the worker claims the
    /// next task while the ending waits. Each ending is still a compare-and-set on the
    /// task's status and lease owner: one whose task was taken over meanwhile is not
    /// applied and is counted lost. The wait delays what follows the ending: the key's
    /// release (and a [`Scope::Queued`](crate::Scope::Queued) follow-up), so keep
    /// `max_delay` short; `Duration::ZERO` records at once what gathered while the last
    /// batch was being recorded, and `max_size` 1 records each ending on its own.
    /// `max_delay` is at most half of what is left of the lease after a heartbeat
    /// interval: the lease is no longer renewed once the handler returned.
    pub fn batch_endings(mut self, max_size: usize, max_delay: Duration) -> WorkerBuilder {
        self.end_batch = max_size;
        self.end_delay = max_delay;
        self
    }

    /// How long finished tasks are kept: the worker prunes the others every
    /// `retention.every` (give or take a fifth), in batches of `retention.batch_size`
    /// rows ([`TaskLifecycle::prune`](crate::TaskLifecycle::prune)), whatever their types.
    /// Every worker prunes; together they delete each row once. Default
    /// [`Retention::default`]: `succeeded` and `cancelled` tasks after 24 hours, `failed`
    /// ones after 7 days. [`Retention::off`] keeps everything.
    pub fn retention(mut self, retention: Retention) -> WorkerBuilder {
        self.retention = retention;
        self
    }

    /// What runs each task of the worker's [`task_types`](Self::task_types): a
    /// [`Handler`], such as an `async` closure `|task, cancel| async move { ... }`, which
    /// receives the task as stored. The escape hatch beside typed handlers
    /// ([`register`](Self::register)); with registered types, list the types it runs in
    /// `task_types`.
    pub fn handler(mut self, handler: impl Handler) -> WorkerBuilder {
        self.handler = Some(Arc::new(handler));
        self
    }

    /// Runs the tasks of type `T` ([`Task::TASK_TYPE`]) with `handler`, which receives
    /// each one's payload decoded ([`Job`](super::Job)) and returns a result stored as
    /// the task's `result`. The worker claims only the types it has a handler for. The
    /// type's [`options`](Task::options) give its retry policy, lease and concurrency
    /// limit (else the worker's); [`task_type_concurrency`](Self::task_type_concurrency) overrides
    /// the limit.
    ///
    /// A task whose payload does not decode into `T` fails for good, its error naming
    /// the type and the decoding error; a result that does not serialize fails the
    /// attempt (retried as the policy says).
    ///
    /// ```no_run
    /// use serde::{Deserialize, Serialize};
    /// use task_dedup::{HandlerError, Job, Task, TaskOptions, Worker};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct SendInvoice { invoice_id: u64 }
    ///
    /// impl Task for SendInvoice {
    ///     const TASK_TYPE: &'static str = "send-invoice";
    ///     fn resource_key(&self) -> String { format!("invoice/{}", self.invoice_id) }
    ///     fn options() -> TaskOptions { TaskOptions::default().concurrency(2) }
    /// }
    ///
    /// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), task_dedup::DedupError> {
    /// let worker = Worker::builder(db)
    ///     .register::<SendInvoice>(|job: Job<SendInvoice>| async move {
    ///         println!("sending invoice {}", job.args.invoice_id);
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn register<T: Task>(mut self, handler: impl TaskHandler<T>) -> WorkerBuilder {
        self.registered.push(Registration {
            task_type: T::TASK_TYPE,
            route: Arc::new(Typed::<T, _>::new(handler)),
            options: T::options(),
        });
        self
    }

    /// Enqueues a task of type `T` at each tick of `schedule`: `make` receives the tick
    /// (the instant it stands for, in UTC) and returns the task. No leader is needed:
    /// every worker that declares the schedule, in any number of processes, enqueues
    /// each tick, and the database keeps one task per tick. The tick's task is scoped to
    /// the window from its tick to the next ([`Scope::Period`](crate::Scope::Period),
    /// whatever `T`'s options say), scheduled at the tick (`run_at`), with
    /// [`OnConflict::ReturnExisting`](crate::OnConflict::ReturnExisting); the key is
    /// `T`'s, so two ticks may share a resource key, and the task of one tick stays
    /// unique while its window lasts, finished or not (retention keeps it that long).
    ///
    /// On start the worker enqueues the latest tick already past (its period is still
    /// running; see [`Schedule::catch_up`]); then each tick when it falls due. If the
    /// database is unreachable at a tick, the enqueue is retried on a fresh connection
    /// within the [`retry_budget`](Self::retry_budget), then every second until it
    /// succeeds or the next tick falls due.
    ///
    /// `T` must be a type this worker runs ([`register`](Self::register) it, or list it in
    /// the untyped handler's [`task_types`](Self::task_types)), so that whoever enqueues
    /// ticks also runs them; [`build`](Self::build) refuses it otherwise. Workers that do
    /// not declare the schedule may run its tasks too.
    ///
    /// ```no_run
    /// use serde::{Deserialize, Serialize};
    /// use task_dedup::{HandlerError, Job, Schedule, Task, Worker};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct NightlyReport { day: chrono::NaiveDate }
    ///
    /// impl Task for NightlyReport {
    ///     const TASK_TYPE: &'static str = "nightly-report";
    ///     fn resource_key(&self) -> String { format!("report/{}", self.day) }
    /// }
    ///
    /// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), task_dedup::DedupError> {
    /// let worker = Worker::builder(db)
    ///     .register::<NightlyReport>(|job: Job<NightlyReport>| async move {
    ///         println!("reporting on {}", job.args.day);
    ///         Ok::<_, HandlerError>(())
    ///     })
    ///     .periodic(Schedule::cron("30 2 * * *").in_tz("Europe/Berlin"), |tick| NightlyReport {
    ///         day: tick.date_naive(),
    ///     })
    ///     .build()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn periodic<T: Task>(
        mut self,
        schedule: Schedule,
        make: impl Fn(chrono::DateTime<chrono::Utc>) -> T + Send + Sync + 'static,
    ) -> WorkerBuilder {
        self.periodic.push(Declared::new::<T>(schedule, make));
        self
    }

    /// Checks the settings and builds the worker.
    ///
    /// # Errors
    /// [`DedupError::DuplicateTaskType`] for a type with two handlers (registered twice,
    /// or registered and in the untyped handler's `task_types`).
    /// [`DedupError::InvalidArgument`] naming the setting: no handler and no registered
    /// type (`handler`), a registered type with an invalid name (`register`), an untyped
    /// handler beside registered types without its `task_types`, or `task_types`
    /// without an untyped handler beside them, a concurrency or
    /// type limit of 0, a limit on a type the worker does not run, an invalid lease, a
    /// heartbeat not shorter than the lease, an invalid retry policy, a poll interval of
    /// 0 or with `min > max`, a fallback poll of 0, a `listen_url` that is not a
    /// PostgreSQL URL or on a worker of another database, an invalid worker id or task
    /// type, a batch of endings of 0 or over `MAX_END_BATCH`, a batch delay over half of
    /// what is left of the lease after a heartbeat interval, an invalid
    /// [`retention`](Self::retention) (named as [`Retention::validate`] names it), or a
    /// periodic task of a type the worker does not run (`periodic`).
    /// [`DedupError::InvalidSchedule`] naming the expression for a schedule that is not
    /// valid ([`periodic`](Self::periodic)).
    pub fn build(self) -> Result<Worker, DedupError> {
        let invalid =
            |name, expected| DedupError::from(InvalidArgument::out_of_range(name, expected));
        if self.handler.is_none() && self.registered.is_empty() {
            return Err(DedupError::InvalidArgument {
                name: "handler",
                reason: InvalidReason::Empty,
            });
        }
        if self.concurrency == 0 {
            return Err(invalid("concurrency", "at least 1"));
        }
        validate::lease_micros(self.lease)?;
        let heartbeat_every = self.heartbeat_every.unwrap_or(self.lease / 3);
        if heartbeat_every.is_zero() || heartbeat_every >= self.lease {
            return Err(invalid(
                "heartbeat_every",
                "more than zero and less than the lease",
            ));
        }
        self.retry.validate()?;
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return Err(invalid(
                "poll_interval",
                "min more than zero and at most max",
            ));
        }
        if self.fallback_poll.is_zero() {
            return Err(invalid("fallback_poll", "more than zero"));
        }
        if self.cancel_poll.is_zero() {
            return Err(invalid("cancel_poll", "more than zero"));
        }
        if let Some(url) = &self.listen_url {
            url.validate(&self.db)?;
        }
        let types: Vec<&str> = self.task_types.iter().map(String::as_str).collect();
        validate::task_types(&types)?;
        let (routes, task_types, type_concurrency) = self.routes(heartbeat_every)?;
        for (task_type, limit) in &type_concurrency {
            if *limit == 0 {
                return Err(invalid("task_type_concurrency", "at least 1"));
            }
            if !task_types.contains(task_type) {
                return Err(invalid(
                    "task_type_concurrency",
                    "a type of task_types or a registered type",
                ));
            }
        }
        let periodic = self
            .periodic
            .iter()
            .map(|declared| declared.check(&task_types).map(Arc::new))
            .collect::<Result<Vec<_>, _>>()?;
        let id = self.id.clone().unwrap_or_else(|| {
            let random = uuid::Uuid::now_v7().simple().to_string();
            format!("task-dedup-{}-{}", std::process::id(), &random[20..])
        });
        validate::worker_id(&id)?;
        if self.end_batch == 0 || self.end_batch > crate::values::validate::MAX_END_BATCH {
            return Err(invalid(
                "batch_endings",
                "a size of 1 to 1,000 (MAX_END_BATCH)",
            ));
        }
        if self.end_delay > self.lease.saturating_sub(heartbeat_every) / 2 {
            return Err(invalid(
                "batch_endings",
                "a delay of at most half of (lease - heartbeat_every)",
            ));
        }
        let reap_every = self.reap_every.unwrap_or(self.lease);
        if reap_every.is_zero() {
            return Err(invalid("reap_every", "more than zero"));
        }
        self.retention.validate()?;
        for (name, timeout) in self
            .timeout
            .iter()
            .map(|t| ("timeout", t))
            .chain(self.timeouts.values().map(|t| ("task_type_timeout", t)))
        {
            if timeout.is_zero() {
                return Err(invalid(name, "more than zero"));
            }
        }
        if let Some(task_type) = self.timeouts.keys().find(|t| !task_types.contains(t)) {
            let _ = task_type;
            return Err(invalid(
                "task_type_timeout",
                "a type of task_types or a registered type",
            ));
        }
        let mut timeouts = self.timeouts.clone();
        for (task_type, typed) in &routes.typed {
            if let Some(timeout) = typed.timeout {
                timeouts.entry(task_type.clone()).or_insert(timeout);
            }
        }
        Ok(Worker {
            db: self.db,
            config: Arc::new(super::Config {
                id,
                task_types,
                type_concurrency,
                timeout: self.timeout,
                timeouts,
                max_snoozes: self.max_snoozes,
                concurrency: self.concurrency,
                lease: self.lease,
                heartbeat_every,
                retry: self.retry,
                reap_every,
                shutdown_grace: self.shutdown_grace,
                cancel_grace: self.cancel_grace,
                wakeups: self.wakeups,
                listen_url: self.listen_url.clone(),
                poll_min: self.poll_min,
                poll_max: self.poll_max,
                fallback_poll: self.fallback_poll,
                cancel_poll: self.cancel_poll,
                retry_budget: self.retry_budget,
                end_batch: self.end_batch,
                end_delay: self.end_delay,
                retention: self.retention,
            }),
            routes: Arc::new(routes),
            periodic,
        })
    }

    /// The routes, the types to claim and their caps in this worker: the registered types (each
    /// once, with a valid name and options) and the untyped handler's.
    #[allow(clippy::type_complexity)]
    fn routes(
        &self,
        heartbeat_every: Duration,
    ) -> Result<(Routes, Vec<String>, HashMap<String, usize>), DedupError> {
        let untyped = self
            .handler
            .clone()
            .map(|handler| Arc::new(Untyped(handler)) as Arc<dyn Route>);
        if self.registered.is_empty() {
            let routes = Routes {
                typed: HashMap::new(),
                untyped,
            };
            return Ok((
                routes,
                self.task_types.clone(),
                self.type_concurrency.clone(),
            ));
        }
        if untyped.is_some() && self.task_types.is_empty() {
            // It cannot mean "every other type": a claim names the types it takes.
            return Err(DedupError::InvalidArgument {
                name: "task_types",
                reason: InvalidReason::OutOfRange(
                    "the untyped handler's types, listed when types are registered",
                ),
            });
        }
        if untyped.is_none() && !self.task_types.is_empty() {
            return Err(DedupError::InvalidArgument {
                name: "task_types",
                reason: InvalidReason::OutOfRange(
                    "only with an untyped handler: registered types are claimed anyway",
                ),
            });
        }
        let mut task_types = self.task_types.clone();
        let mut limits = HashMap::new();
        let mut typed = HashMap::new();
        for registration in &self.registered {
            let task_type = registration.task_type;
            validate::text(task_type, task_run::TASK_TYPE_MAX_CHARS).map_err(|reason| {
                DedupError::InvalidArgument {
                    name: "register",
                    reason,
                }
            })?;
            if task_types.iter().any(|t| t == task_type) {
                return Err(DedupError::DuplicateTaskType {
                    task_type: task_type.to_owned(),
                });
            }
            task_types.push(task_type.to_owned());
            let options = &registration.options;
            let retry = options.retry.unwrap_or(self.retry);
            retry.validate()?;
            let (lease, heartbeat_every) = match options.lease {
                Some(lease) => {
                    validate::lease_micros(lease)?;
                    (lease, heartbeat_every.min(lease / 3))
                }
                None => (self.lease, heartbeat_every),
            };
            if heartbeat_every.is_zero() {
                return Err(
                    InvalidArgument::out_of_range("lease", "at least 3 microseconds").into(),
                );
            }
            if let Some(limit) = options.concurrency {
                limits.insert(task_type.to_owned(), limit);
            }
            typed.insert(
                task_type.to_owned(),
                TypeRoute {
                    route: registration.route.clone(),
                    retry,
                    lease,
                    heartbeat_every,
                    timeout: options.timeout,
                },
            );
        }
        limits.extend(self.type_concurrency.iter().map(|(t, l)| (t.clone(), *l)));
        Ok((Routes { typed, untyped }, task_types, limits))
    }
}

/// The listener's URL: kept out of `Debug`, since it may hold a password.
#[derive(Clone)]
pub(super) struct ListenUrl(pub(super) String);

impl fmt::Debug for ListenUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ListenUrl(..)")
    }
}

impl ListenUrl {
    /// Refuses a URL that is not PostgreSQL's, or a worker whose pool is not.
    fn validate(&self, db: &DatabaseConnection) -> Result<(), DedupError> {
        let refused =
            |expected| DedupError::from(InvalidArgument::out_of_range("listen_url", expected));
        if sea_orm::ConnectionTrait::get_database_backend(db) != sea_orm::DbBackend::Postgres {
            return Err(refused("only for a worker on PostgreSQL"));
        }
        let postgres = ["postgres://", "postgresql://"];
        #[cfg(feature = "postgres")]
        let parses = self
            .0
            .parse::<sea_orm::sqlx::postgres::PgConnectOptions>()
            .is_ok();
        #[cfg(not(feature = "postgres"))]
        let parses = false;
        // sqlx parses any scheme as PostgreSQL's: the scheme is checked here.
        if !postgres.iter().any(|scheme| self.0.starts_with(scheme)) || !parses {
            return Err(refused(
                "a PostgreSQL URL (postgres://user@host:port/database)",
            ));
        }
        Ok(())
    }
}
