//! [`TaskDedupQueue`]: Loco's `QueueProvider` over `task_run` and task-dedup's Worker.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use loco_rs::app::AppContext;
use loco_rs::bgworker::{BackgroundWorker, Job, JobHandler, JobStatus, Queue, QueueProvider};
use loco_rs::config::WorkerMode;
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, TransactionTrait};
use serde::Serialize;
use serde_json::Value;
use task_dedup::{
    Enqueued, ListTasks, MAX_ADMIN_BATCH, NewTask, RetryPolicy, TaskAdmin, TaskDedup, TaskFilter,
    TaskLifecycle, TaskStatus, Worker, WorkerBuilder,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::{QueueError, loco};
use crate::jobs;
use crate::keys::Dedup;
use crate::registry::{Dispatch, Registry};
use crate::start;

type Configure = dyn Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync;

/// task-dedup as a Loco application's queue: `perform_later` is `find_or_enqueue`, the
/// workers run on task-dedup's [`Worker`].
///
/// - **Jobs are tasks.** A job of worker class `C` with arguments `a` is a `task_run`
///   row of `task_type = C`, its key given by the class's [`Dedup`] rule (by default
///   the arguments' hash, [`Dedup::ByArgs`]), its payload `{"loco": {"args": a,
///   "queue": .., "tags": [..]}}`. The job id Loco returns is the task id: a repeated
///   `perform_later` returns the id of the job already in flight.
/// - **Loco's fields**: `priority` is the task's (saturated to `i16`, higher first);
///   `tags` choose which classes a worker process runs, as in Loco's own queues (a
///   worker without tags runs the untagged classes; with tags, the classes carrying
///   one of them); `queue` is kept in the payload only (Loco's SQL queues ignore it
///   too).
/// - **Running**: Loco's `run` starts a [`Worker`] over the registered classes, with
///   its retries, leases, per-key serial execution, wake-ups (LISTEN/NOTIFY on
///   PostgreSQL), batched endings and whatever [`TaskDedupQueueBuilder::worker`] sets.
///   A handler's error is retried by the worker's [`RetryPolicy`]; arguments that do
///   not decode into the worker's type fail the job at once, with the decoding error.
/// - **A class that no process registered**: its jobs wait, queued, and the dashboard
///   shows them (type, age); nothing fails.
///
/// Build it once per process, [`install`](Self::install) it in `Hooks::after_context`,
/// and keep a clone where the application needs [`enqueue`](Self::enqueue) (created or
/// existing, in the request's transaction).
#[derive(Clone)]
pub struct TaskDedupQueue {
    db: DatabaseConnection,
    registry: Arc<Registry>,
    configure: Arc<Configure>,
    retry_budget: Option<Duration>,
    shutdown: CancellationToken,
    /// PostgreSQL: the application's database URL, for the worker's wake-up listener
    /// (set by [`install`](Self::install)).
    listen_url: Arc<OnceLock<String>>,
}

impl std::fmt::Debug for TaskDedupQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskDedupQueue")
            .field("classes", &self.registry.classes())
            .finish_non_exhaustive()
    }
}

/// Builds a [`TaskDedupQueue`]: [`TaskDedupQueue::builder`].
#[must_use]
pub struct TaskDedupQueueBuilder {
    db: DatabaseConnection,
    default_dedup: Dedup,
    classes: Vec<(String, Option<Dedup>, Vec<String>)>,
    configure: Arc<Configure>,
    retry_budget: Option<Duration>,
}

impl TaskDedupQueueBuilder {
    /// The rule of the classes not given one by [`class`](Self::class). Default
    /// [`Dedup::ByArgs`].
    pub fn default_dedup(mut self, dedup: Dedup) -> TaskDedupQueueBuilder {
        self.default_dedup = dedup;
        self
    }

    /// Worker class `W`'s rule, and its tags (`W::tags()`), known from the start: a
    /// process that runs tagged classes without enqueueing them needs them.
    pub fn class<W, A>(mut self, dedup: Dedup) -> TaskDedupQueueBuilder
    where
        W: BackgroundWorker<A>,
        A: Send + Sync + Serialize + 'static,
    {
        self.classes.push((W::class_name(), Some(dedup), W::tags()));
        self
    }

    /// Sets the [`Worker`] that Loco's `run` starts: concurrency, lease, retry policy,
    /// retention, wake-ups, ... (`Worker::builder`'s defaults otherwise).
    pub fn worker(
        mut self,
        configure: impl Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync + 'static,
    ) -> TaskDedupQueueBuilder {
        self.configure = Arc::new(configure);
        self
    }

    /// How long `perform_later` keeps retrying on a fresh connection after its
    /// connection was lost, e.g. while the database restarts
    /// ([`NewTask::retry_budget`]). Default: the pool handle's, else
    /// [`task_dedup::DEFAULT_RETRY_BUDGET`] (5 s).
    pub fn retry_budget(mut self, budget: Duration) -> TaskDedupQueueBuilder {
        self.retry_budget = Some(budget);
        self
    }

    /// The queue.
    pub fn build(self) -> TaskDedupQueue {
        let registry = Registry::new(self.default_dedup);
        for (class, dedup, tags) in self.classes {
            registry.declare(class, dedup, tags);
        }
        TaskDedupQueue {
            db: self.db,
            registry: Arc::new(registry),
            configure: self.configure,
            retry_budget: self.retry_budget,
            shutdown: CancellationToken::new(),
            listen_url: Arc::new(OnceLock::new()),
        }
    }
}

impl TaskDedupQueue {
    /// A queue on `db`, a pool opened by `task_dedup::connect` or Loco's own
    /// (`ctx.db`), where task-dedup's migrations ran.
    pub fn builder(db: DatabaseConnection) -> TaskDedupQueueBuilder {
        TaskDedupQueueBuilder {
            db,
            default_dedup: Dedup::ByArgs,
            classes: Vec::new(),
            configure: Arc::new(|builder| builder),
            retry_budget: None,
        }
    }

    /// `ctx` with this queue as its queue provider. Call it in `Hooks::after_context`.
    ///
    /// The config keeps `workers.mode: BackgroundAsync` (what `loco new --bg async`
    /// writes) and has no `queue:` section: Loco refuses `BackgroundQueue` without one,
    /// and would open a queue of its own for one. `install` turns the mode into
    /// `BackgroundQueue` with this queue, so `perform_later` enqueues here and
    /// `cargo loco start --worker` / `--server-and-worker` run its worker.
    /// `ForegroundBlocking` (the generated test config) is kept: jobs run inline in the
    /// request, as the application's tests expect, and [`enqueue`](Self::enqueue) and
    /// Loco's `run` still use this queue.
    ///
    /// Under `cargo loco start`, Loco 1.2 builds the context twice, the second from the
    /// first one's config, and refuses the second build if that config says
    /// `BackgroundQueue` without a `queue:` section. So the first context of a `start`
    /// process keeps the configured mode (it serves as nothing but the second one's
    /// config) and the second, which the server and the workers run on, gets
    /// `BackgroundQueue`. `install` recognises `start` from the process's arguments as
    /// Loco's command line has them (`[-e ENV] start|s ...`).
    ///
    /// On PostgreSQL the worker's wake-up listener connects to the application's
    /// `database.uri` on a connection of its own, rather than holding one of the pool
    /// for its life: Loco's generated development config has a pool of a single
    /// connection, which a listener in it would keep from the requests and the claims.
    /// A queue on another pool than `ctx.db`, or a database reached through a
    /// transaction pooler, sets its own with `.worker(|w| w.listen_url(..))`.
    #[must_use]
    pub fn install(&self, mut ctx: AppContext) -> AppContext {
        if self.db.get_database_backend() == DbBackend::Postgres
            && let Some(uri) = database_uri(&ctx.config)
            && (uri.starts_with("postgres://") || uri.starts_with("postgresql://"))
        {
            // A second install of the same queue keeps the first URL.
            let _ = self.listen_url.set(uri);
        }
        if ctx.config.workers.mode != WorkerMode::ForegroundBlocking {
            if start::first_build_of_start() {
                tracing::debug!(
                    "task-dedup-loco: the first of Loco's two context builds under `start`; \
                     the mode is switched to BackgroundQueue in the second"
                );
            } else {
                ctx.config.workers.mode = WorkerMode::BackgroundQueue;
            }
        }
        ctx.queue_provider = Some(Arc::new(Queue::from_provider(Arc::new(self.clone()))));
        ctx
    }

    /// The pool the queue runs on.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// `W::perform_later(args)` on `conn`, which may be the request's transaction (the
    /// job then exists only if it commits), telling whether it created the job or
    /// found it in flight ([`Enqueued::is_created`]; the task id is the job id).
    ///
    /// # Errors
    /// As [`TaskDedup::find_or_enqueue`] and the class's key rule; arguments that do
    /// not serialize are [`QueueError::KeyUnreadable`].
    pub async fn enqueue<W, A, C>(&self, conn: &C, args: &A) -> Result<Enqueued, QueueError>
    where
        W: BackgroundWorker<A>,
        A: Send + Sync + Serialize + 'static,
        C: TaskDedup + Sync,
    {
        let class = W::class_name();
        let args = serde_json::to_value(args).map_err(|err| QueueError::KeyUnreadable {
            class: class.clone(),
            reason: err.to_string(),
        })?;
        let tags = W::tags();
        let tags = (!tags.is_empty()).then_some(tags);
        let task = self.task(&class, W::queue().as_deref(), args, tags.as_deref(), None)?;
        Ok(conn.find_or_enqueue(task).await?)
    }

    fn task(
        &self,
        class: &str,
        queue: Option<&str>,
        args: Value,
        tags: Option<&[String]>,
        priority: Option<i32>,
    ) -> Result<NewTask, QueueError> {
        let key = self.registry.dedup(class).key(class, &args)?;
        self.registry.saw_tags(class, tags);
        let task = NewTask::new(key)
            .with_payload(jobs::envelope(args, queue, tags))
            .priority(jobs::priority(priority));
        Ok(match self.retry_budget {
            Some(budget) => task.retry_budget(budget),
            None => task,
        })
    }

    /// Loco's jobs among the tasks that `statuses` (all when `None`) and `before`
    /// select, page by page: every task whose payload carries Loco's envelope, and
    /// every task of a class this process knows. A `cargo loco jobs` process registers
    /// no worker, so the envelope is what finds the jobs of every class there.
    async fn jobs(
        &self,
        statuses: Option<&[TaskStatus]>,
        before: Option<chrono::DateTime<Utc>>,
    ) -> Result<Vec<task_dedup::task_run::Model>, QueueError> {
        let known = self.registry.classes();
        let mut filter = TaskFilter::new();
        if let Some(statuses) = statuses {
            filter = filter.statuses(statuses.iter().copied());
        }
        if let Some(before) = before {
            filter = filter.created_before(before);
        }
        let mut query = ListTasks::new(filter).limit(MAX_ADMIN_BATCH);
        let mut tasks = Vec::new();
        loop {
            let page = self.db.list_tasks(&query).await?;
            tasks.extend(page.tasks.into_iter().filter(|task| {
                jobs::args(task.payload.as_ref()).is_some()
                    || known.binary_search(&task.task_type).is_ok()
            }));
            match page.next {
                Some(next) => query = query.after(Some(next)),
                None => return Ok(tasks),
            }
        }
    }

    /// Removes the tasks that `statuses` and `before` select: an active one is
    /// cancelled first (a running handler hears of it at its next heartbeat), so that
    /// no worker is left holding a row that is gone.
    async fn remove(
        &self,
        statuses: Option<&[TaskStatus]>,
        before: Option<chrono::DateTime<Utc>>,
    ) -> Result<(), QueueError> {
        for task in self.jobs(statuses, before).await? {
            if task.status.is_active() {
                match self
                    .db
                    .cancel_task(task.id, "cleared from the Loco queue")
                    .await
                {
                    Ok(_) | Err(task_dedup::DedupError::InvalidTransition { .. }) => {}
                    Err(task_dedup::DedupError::NotFound { .. }) => continue,
                    Err(err) => return Err(err.into()),
                }
            }
            match self.db.delete_task(task.id).await {
                // Gone meanwhile, or started again by an operator: left alone.
                Ok(())
                | Err(
                    task_dedup::DedupError::NotFound { .. }
                    | task_dedup::DedupError::InvalidTransition { .. },
                ) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
    }
}

/// The config's `database.uri`. This crate builds loco-rs without its `with-db`
/// feature (the application's loco-rs has it), so the field is read from the config's
/// serialized form.
fn database_uri(config: &loco_rs::config::Config) -> Option<String> {
    let config = serde_json::to_value(config).ok()?;
    Some(config.get("database")?.get("uri")?.as_str()?.to_owned())
}

fn statuses(status: Option<&Vec<JobStatus>>) -> Option<Vec<TaskStatus>> {
    status.map(|s| s.iter().map(jobs::task_status).collect())
}

fn days_ago(days: i64) -> chrono::DateTime<Utc> {
    Utc::now() - chrono::Duration::days(days)
}

#[async_trait]
impl QueueProvider for TaskDedupQueue {
    async fn enqueue(
        &self,
        class: String,
        queue: Option<String>,
        args: Value,
        tags: Option<Vec<String>>,
        priority: Option<i32>,
    ) -> loco_rs::Result<Option<String>> {
        let task = self
            .task(&class, queue.as_deref(), args, tags.as_deref(), priority)
            .map_err(loco)?;
        let outcome = self.db.find_or_enqueue(task).await.map_err(loco)?;
        Ok(Some(outcome.task().id.to_string()))
    }

    /// One transaction: every job is enqueued or none is, as Loco's own queues promise.
    async fn enqueue_batch(
        &self,
        class: String,
        queue: Option<String>,
        jobs: Vec<(Value, Option<i32>)>,
        tags: Option<Vec<String>>,
    ) -> loco_rs::Result<Vec<String>> {
        let tasks = jobs
            .into_iter()
            .map(|(args, priority)| {
                self.task(&class, queue.as_deref(), args, tags.as_deref(), priority)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(loco)?;
        let txn = self
            .db
            .begin()
            .await
            .map_err(|e| loco(task_dedup::DedupError::from(e)))?;
        let outcomes = txn.find_or_enqueue_many(tasks).await.map_err(loco)?;
        txn.commit()
            .await
            .map_err(|e| loco(task_dedup::DedupError::from(e)))?;
        Ok(outcomes.iter().map(|o| o.task().id.to_string()).collect())
    }

    async fn register_handler(&self, name: String, handler: JobHandler) -> loco_rs::Result<()> {
        self.registry.register(name, handler);
        Ok(())
    }

    async fn run(&self, tags: Vec<String>) -> loco_rs::Result<()> {
        let classes = self.registry.runnable(&tags);
        if classes.is_empty() {
            return Err(loco(QueueError::NothingToRun { tags }));
        }
        // A missing `task_run` stops the worker here, saying to migrate, rather than
        // failing every claim.
        self.setup().await?;
        tracing::info!(?classes, "task-dedup worker starting for Loco");
        let mut builder = Worker::builder(self.db.clone())
            .task_types(classes)
            .handler(Dispatch(self.registry.clone()));
        if let Some(url) = self.listen_url.get() {
            // Before the application's settings, which may set another.
            builder = builder.listen_url(url.clone());
        }
        let worker = (self.configure)(builder).build().map_err(loco)?;
        let report = worker.run(self.shutdown.clone()).await.map_err(loco)?;
        tracing::info!(?report, "task-dedup worker stopped");
        Ok(())
    }

    /// Checks that `task_run` is there: the schema comes from the application's
    /// migrations (task-dedup's appended to its own), not from the queue.
    async fn setup(&self) -> loco_rs::Result<()> {
        self.db
            .list_tasks(&ListTasks::new(TaskFilter::new()).limit(1))
            .await
            .map_err(loco)?;
        Ok(())
    }

    async fn clear(&self) -> loco_rs::Result<()> {
        self.remove(None, None).await.map_err(loco)
    }

    async fn ping(&self) -> loco_rs::Result<()> {
        self.db
            .execute_unprepared("SELECT 1")
            .await
            .map_err(|e| loco(task_dedup::DedupError::from(e)))?;
        Ok(())
    }

    async fn get_jobs(
        &self,
        status: Option<&Vec<JobStatus>>,
        age_days: Option<i64>,
    ) -> loco_rs::Result<Vec<Job>> {
        let statuses = statuses(status);
        let tasks = self
            .jobs(statuses.as_deref(), age_days.map(days_ago))
            .await
            .map_err(loco)?;
        Ok(tasks.into_iter().map(jobs::job).collect())
    }

    async fn cancel_jobs_by_name(&self, name: &str) -> loco_rs::Result<()> {
        let filter = TaskFilter::new().task_type(name).status(TaskStatus::Queued);
        loop {
            let outcome = self
                .db
                .cancel_tasks(&filter, MAX_ADMIN_BATCH, "cancelled through Loco")
                .await
                .map_err(loco)?;
            if outcome.selected == 0 {
                return Ok(());
            }
        }
    }

    async fn clear_by_status(&self, status: Vec<JobStatus>) -> loco_rs::Result<()> {
        let statuses = statuses(Some(&status));
        self.remove(statuses.as_deref(), None).await.map_err(loco)
    }

    async fn clear_jobs_older_than(
        &self,
        age_days: i64,
        status: Option<&Vec<JobStatus>>,
    ) -> loco_rs::Result<()> {
        let statuses = statuses(status);
        self.remove(statuses.as_deref(), Some(days_ago(age_days)))
            .await
            .map_err(loco)
    }

    /// A job "stuck in processing" is, here, one whose lease ran out: the reaper's
    /// pass, run now (with the default retry policy). A job that still heartbeats is
    /// running, however long, and `age_minutes` does not change that.
    async fn requeue(&self, _age_minutes: &i64) -> loco_rs::Result<()> {
        self.db
            .reap_expired(&RetryPolicy::default())
            .await
            .map_err(loco)?;
        Ok(())
    }

    async fn retry_failed(&self, id: Option<&str>) -> loco_rs::Result<u64> {
        if let Some(id) = id {
            let id = Uuid::parse_str(id)
                .map_err(|_| loco(QueueError::InvalidJobId { id: id.to_owned() }))?;
            self.db.retry_task(id).await.map_err(loco)?;
            return Ok(1);
        }
        let mut retried = 0;
        let failed = self
            .jobs(Some(&[TaskStatus::Failed]), None)
            .await
            .map_err(loco)?;
        for task in failed {
            match self.db.retry_task(task.id).await {
                Ok(_) => retried += 1,
                // Its key held by another job (which does the work), retried or deleted
                // meanwhile: left as it is.
                Err(
                    task_dedup::DedupError::KeyHeld { .. }
                    | task_dedup::DedupError::InvalidTransition { .. }
                    | task_dedup::DedupError::NotFound { .. },
                ) => {}
                Err(err) => return Err(loco(err)),
            }
        }
        Ok(retried)
    }

    fn describe(&self) -> String {
        format!("task-dedup queue ({:?})", self.db.get_database_backend())
    }

    fn shutdown(&self) -> loco_rs::Result<()> {
        self.shutdown.cancel();
        Ok(())
    }
}
