//! [`TaskDedup::find_or_enqueue`]: insert first, read on conflict, never check-then-insert;
//! its batch form ([`bulk`]), the keys it expects to be hits ([`hot_keys`]) and the check
//! that the unique index exists before the first write ([`guard`]).

pub(crate) mod bulk;
pub(crate) mod guard;
pub(crate) mod hot_keys;
pub(crate) mod outcome;

use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument;
use uuid::Uuid;

use self::hot_keys::Hot;
use self::outcome::Enqueued;
use crate::connect::retry::{MAX_ENQUEUE_ATTEMPTS, Retrying};
use crate::executor::notify;
use crate::executor::{Executor, Inserted};
use crate::metrics;
use crate::values::connection::{DedupConnection, PoolerMode, WithPoolerMode, WithRetryBudget};
use crate::values::error::DedupError;
use crate::values::key::{KeyParts, TaskKey};
use crate::values::task::{NewTask, OnConflict, Scope};
use crate::values::typed::Task;
use task_dedup_entity::task_run;

/// Atomic find-or-enqueue, on a pool or inside the caller's transaction.
///
/// Implemented for every [`DedupConnection`]:
/// [`DatabaseConnection`](sea_orm::DatabaseConnection),
/// [`DatabaseTransaction`](sea_orm::DatabaseTransaction),
/// [`DatabaseExecutor`](sea_orm::DatabaseExecutor), and those
/// [`WithRetryBudget`]. Sealed: not for implementing elsewhere.
#[async_trait]
pub trait TaskDedup: crate::values::connection::sealed::Sealed {
    /// Enqueues `task` unless another task holds its key, and says which happened.
    ///
    /// Which states hold a key is the task's [`Scope`] (default: `queued` or `running`);
    /// what a hit does is its [`OnConflict`] (default: return the task as stored). The
    /// insert comes first and the database's unique index decides; only on a conflict is
    /// the task holding the key read and returned as [`Enqueued::Existing`] (or updated,
    /// with `ReplaceIfQueued`). Under any number of concurrent callers exactly one gets
    /// [`Enqueued::Created`]. The created path is one statement; the duplicate path with
    /// the default policy writes nothing, and on PostgreSQL it is one statement too for a
    /// key this process enqueued or found recently (the insert that returns the holder;
    /// the read follows only when the holder committed while that statement ran). Inside
    /// a transaction a hit leaves the transaction usable (no aborted statement on
    /// PostgreSQL).
    ///
    /// `created_at`/`updated_at` of a new task, and its `run_at` unless given, come from
    /// this process's clock; lease times and due times are compared with the database's.
    ///
    /// # Errors
    /// - [`DedupError::InvalidArgument`] when the payload has a NUL character in a
    ///   string or key (PostgreSQL cannot store it) or a period is not whole seconds;
    ///   nothing is written.
    /// - [`DedupError::Contention`] when the task holding the key kept letting go of it
    ///   before it could be read, [`MAX_ENQUEUE_ATTEMPTS`] times in a row.
    /// - [`DedupError::TransactionAborted`] inside a transaction the database aborted to
    ///   resolve a deadlock or serialization conflict (e.g. REPEATABLE READ on
    ///   PostgreSQL); roll back and retry the transaction.
    /// - [`DedupError::Database`] for anything else, including an unreachable database.
    ///
    /// # Example
    /// ```no_run
    /// use task_dedup::{NewTask, TaskDedup, TaskKey};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let db = task_dedup::connect("sqlite::memory:").await?;
    /// # use task_dedup_migration::MigratorTrait;
    /// task_dedup_migration::Migrator::up(&db, None).await?;
    ///
    /// let key = TaskKey::new("user-1", "render", "document/42")?;
    /// let first = db.find_or_enqueue(NewTask::new(key.clone())).await?;
    /// let second = db.find_or_enqueue(NewTask::new(key)).await?;
    /// assert!(first.is_created());
    /// assert!(!second.is_created());
    /// assert_eq!(first.task().id, second.task().id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    async fn find_or_enqueue(&self, task: NewTask) -> Result<Enqueued, DedupError>;

    /// The task holding `key` under [`Scope::Active`] or [`Scope::Queued`], if any: the
    /// one a [`find_or_enqueue`](Self::find_or_enqueue) with either scope would run into.
    /// (With a queued task behind a running `Queued`-scope task, the queued one.) For
    /// [`Scope::Period`], see [`find_occupant`](Self::find_occupant).
    ///
    /// # Errors
    /// [`DedupError::Database`].
    async fn find_active(&self, key: &TaskKey) -> Result<Option<task_run::Model>, DedupError>;

    /// The task that `task` would run into if it were enqueued now: for
    /// [`Scope::Period`], the task of the current period window.
    ///
    /// # Errors
    /// [`DedupError::InvalidArgument`] for a period that is not whole seconds;
    /// [`DedupError::Database`].
    async fn find_occupant(&self, task: &NewTask) -> Result<Option<task_run::Model>, DedupError>;

    /// [`find_or_enqueue`](Self::find_or_enqueue) for many tasks at once: one outcome per
    /// task, in input order, each what `find_or_enqueue` would have returned for it with
    /// the same policies, in a few statements per chunk of tasks rather than per task.
    ///
    /// - A key (and window) repeated in the batch: its first occurrence decides; the
    ///   others get [`Enqueued::Existing`] of that task.
    /// - Each task is atomic under concurrency as in `find_or_enqueue`: a key another
    ///   caller takes meanwhile comes back `Existing`; two overlapping batches never both
    ///   create a key.
    /// - On a pool the batch is split into chunks (5,000 tasks on PostgreSQL, 2,000 on
    ///   SQLite and MySQL/MariaDB, within their parameter limits), each atomic on its own:
    ///   an error leaves the earlier chunks enqueued. Inside the caller's transaction
    ///   everything runs in it.
    /// - A lost connection is retried as in `find_or_enqueue`, within the smallest
    ///   [`retry_budget`](NewTask::retry_budget) the tasks set (or the handle's), a
    ///   chunk whose round may have committed coming back `Existing`.
    ///
    /// # Errors
    /// [`DedupError::InvalidItem`] with the index of the first invalid task, before any
    /// SQL runs; otherwise as [`find_or_enqueue`](Self::find_or_enqueue).
    ///
    /// # Example
    /// ```no_run
    /// use task_dedup::{NewTask, TaskDedup, TaskKey};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let db = task_dedup::connect("sqlite::memory:").await?;
    /// # use task_dedup_migration::MigratorTrait;
    /// task_dedup_migration::Migrator::up(&db, None).await?;
    ///
    /// let batch = ["doc/1", "doc/2", "doc/1"]
    ///     .into_iter()
    ///     .map(|doc| Ok(NewTask::new(TaskKey::new("user-1", "reindex", doc)?)))
    ///     .collect::<Result<Vec<_>, task_dedup::DedupError>>()?;
    /// let outcomes = db.find_or_enqueue_many(batch).await?;
    /// assert!(outcomes[0].is_created() && outcomes[1].is_created());
    /// assert_eq!(outcomes[2].task().id, outcomes[0].task().id);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    async fn find_or_enqueue_many<I>(&self, tasks: I) -> Result<Vec<Enqueued>, DedupError>
    where
        I: IntoIterator<Item = NewTask> + Send,
        I::IntoIter: Send;

    /// [`find_or_enqueue`](Self::find_or_enqueue) of a typed task: the [`NewTask`] that
    /// [`NewTask::from_task`] makes of it (its key from its fields, the value as its
    /// payload, its type's [`options`](crate::Task::options)). Same outcomes, same
    /// guarantee; [`Enqueued::decode`] reads the stored payload back (on a hit, the
    /// holder's). To change a policy for one call, build the task with
    /// [`NewTask::from_task`] and change it there.
    ///
    /// # Errors
    /// As [`NewTask::from_task`] (before any SQL runs), then as
    /// [`find_or_enqueue`](Self::find_or_enqueue).
    ///
    /// # Example
    /// ```no_run
    /// use serde::{Deserialize, Serialize};
    /// use task_dedup::{Task, TaskDedup};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Reindex {
    ///     post_id: i64,
    /// }
    ///
    /// impl Task for Reindex {
    ///     const TASK_TYPE: &'static str = "reindex";
    ///     fn resource_key(&self) -> String {
    ///         format!("post/{}", self.post_id)
    ///     }
    /// }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let db = task_dedup::connect("sqlite::memory:").await?;
    /// # use task_dedup_migration::MigratorTrait;
    /// task_dedup_migration::Migrator::up(&db, None).await?;
    ///
    /// let first = db.enqueue(&Reindex { post_id: 42 }).await?;
    /// let again = db.enqueue(&Reindex { post_id: 42 }).await?;
    /// assert!(first.is_created() && !again.is_created());
    /// assert_eq!(again.decode::<Reindex>()?.post_id, 42);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    async fn enqueue<T: Task>(&self, task: &T) -> Result<Enqueued, DedupError> {
        let task = NewTask::from_task(task)?;
        self.find_or_enqueue(task).await
    }

    /// [`find_or_enqueue_many`](Self::find_or_enqueue_many) of typed tasks, each made
    /// into its [`NewTask`] as [`enqueue`](Self::enqueue) does: one outcome per task, in
    /// input order; a key repeated in the batch gets the first occurrence's task.
    ///
    /// # Errors
    /// [`DedupError::InvalidItem`] with the index of the first task whose key or payload
    /// is invalid, before any SQL runs; otherwise as
    /// [`find_or_enqueue_many`](Self::find_or_enqueue_many).
    async fn enqueue_many<'a, T, I>(&self, tasks: I) -> Result<Vec<Enqueued>, DedupError>
    where
        T: Task,
        I: IntoIterator<Item = &'a T> + Send,
        I::IntoIter: Send,
    {
        let tasks = tasks
            .into_iter()
            .enumerate()
            .map(|(index, task)| {
                NewTask::from_task(task).map_err(|source| DedupError::InvalidItem {
                    index,
                    source: Box::new(source),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.find_or_enqueue_many(tasks).await
    }

    /// This handle, with calls that retry on a fresh connection for `budget` after
    /// their connection was lost (on a pool), instead of
    /// [`DEFAULT_RETRY_BUDGET`](crate::DEFAULT_RETRY_BUDGET). `Duration::ZERO` turns
    /// the retries off. A task's own [`NewTask::retry_budget`] still wins.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use task_dedup::{NewTask, TaskDedup, TaskKey, TaskLifecycle};
    ///
    /// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), task_dedup::DedupError> {
    /// let impatient = db.with_retry_budget(Duration::from_millis(500));
    /// impatient.find_or_enqueue(NewTask::new(TaskKey::new("u", "t", "r")?)).await?;
    /// impatient.reap_expired(&Default::default()).await?;
    /// # Ok(())
    /// # }
    /// ```
    fn with_retry_budget(&self, budget: Duration) -> WithRetryBudget<'_, Self>
    where
        Self: DedupConnection + Sized,
    {
        WithRetryBudget::new(self, budget)
    }

    /// This handle, sending its PostgreSQL statements as `mode` says, whatever its
    /// pool's mode ([`connect_with_pooler`](crate::connect_with_pooler)). What your
    /// transaction through a pooler without named prepared statements (PgBouncer before
    /// 1.21 in transaction mode) needs: a transaction does not tell task-dedup which pool
    /// it came from, and runs in the default mode without this. SQLite and
    /// MySQL/MariaDB ignore it.
    ///
    /// ```no_run
    /// use sea_orm::TransactionTrait;
    /// use task_dedup::{NewTask, PoolerMode, TaskDedup, TaskKey};
    ///
    /// # async fn f(pooled: sea_orm::DatabaseConnection) -> Result<(), task_dedup::DedupError> {
    /// let txn = pooled.begin().await?;
    /// let key = TaskKey::new("user-1", "export", "all")?;
    /// txn.with_pooler_mode(PoolerMode::NoPreparedStatements)
    ///     .find_or_enqueue(NewTask::new(key))
    ///     .await?;
    /// txn.commit().await?;
    /// # Ok(())
    /// # }
    /// ```
    fn with_pooler_mode(&self, mode: PoolerMode) -> WithPoolerMode<'_, Self>
    where
        Self: DedupConnection + Sized,
    {
        WithPoolerMode::new(self, mode)
    }
}

#[async_trait]
impl<C: DedupConnection> TaskDedup for C {
    async fn find_or_enqueue(&self, task: NewTask) -> Result<Enqueued, DedupError> {
        // The span only where a subscriber takes it: a disabled span still costs at
        // every poll of what it wraps, on every call (BENCHMARKS.md, "Client CPU per
        // hit"). Recorded on by name, never through `Span::current()`, which is the
        // caller's span when this one is disabled.
        let span = tracing::debug_span!(
            "find_or_enqueue",
            key = %task.key,
            task_id = tracing::field::Empty,
            outcome = tracing::field::Empty
        );
        let outcome = if span.is_disabled() {
            find_or_enqueue_on(self, task).await
        } else {
            find_or_enqueue_on(self, task)
                .instrument(span.clone())
                .await
        };
        if let Ok(enqueued) = &outcome
            && !span.is_disabled()
        {
            span.record("task_id", tracing::field::display(enqueued.task().id));
            span.record("outcome", enqueued.outcome_name());
        }
        outcome
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key = %key))]
    async fn find_active(&self, key: &TaskKey) -> Result<Option<task_run::Model>, DedupError> {
        let window_end = Scope::Active.window_end(task_run::now());
        occupant(self, key, window_end, None, "find_active").await
    }

    #[tracing::instrument(level = "debug", skip_all, fields(tasks))]
    async fn find_or_enqueue_many<I>(&self, tasks: I) -> Result<Vec<Enqueued>, DedupError>
    where
        I: IntoIterator<Item = NewTask> + Send,
        I::IntoIter: Send,
    {
        let tasks: Vec<NewTask> = tasks.into_iter().collect();
        tracing::Span::current().record("tasks", tasks.len());
        let budget = tasks.iter().filter_map(|task| task.retry_budget).min();
        let outcomes = bulk::find_or_enqueue_many(self, budget, tasks).await?;
        let created = outcomes.iter().filter(|o| o.is_created()).count() as u64;
        let replaced = outcomes.iter().filter(|o| o.is_replaced()).count() as u64;
        metrics::enqueued("created", created);
        metrics::enqueued("replaced", replaced);
        metrics::enqueued("existing", outcomes.len() as u64 - created - replaced);
        let now = task_run::now();
        if outcomes
            .iter()
            .any(|o| !matches!(o, Enqueued::Existing(_)) && o.task().run_at <= now)
        {
            notify::task_due(&mut Executor::on(self)?).await?;
        }
        Ok(outcomes)
    }

    #[tracing::instrument(level = "debug", skip_all, fields(key = %task.key))]
    async fn find_occupant(&self, task: &NewTask) -> Result<Option<task_run::Model>, DedupError> {
        task.validate()?;
        let window_end = task.window_end_at(task_run::now());
        occupant(
            self,
            &task.key,
            window_end,
            task.retry_budget,
            "find_occupant",
        )
        .await
    }
}

/// The task holding `key` in window `window_end`, read with the retries of `operation`.
async fn occupant<C: DedupConnection>(
    db: &C,
    key: &TaskKey,
    window_end: i64,
    budget: Option<Duration>,
    operation: &'static str,
) -> Result<Option<task_run::Model>, DedupError> {
    let mut exec = Executor::on(db)?;
    let mut retrying = Retrying::new(db, budget, operation);
    loop {
        let attempt = async { Ok(exec.find_occupant(key.parts(), window_end, false).await?) };
        if let Some(outcome) = retrying.run(attempt).await {
            return outcome;
        }
    }
}

/// [`TaskDedup::find_or_enqueue`] on `db`, without its span.
async fn find_or_enqueue_on<C: DedupConnection + ?Sized>(
    db: &C,
    task: NewTask,
) -> Result<Enqueued, DedupError> {
    task.validate()?;
    let mut exec = Executor::on(db)?;
    let (on_conflict, budget, mut row) = task.into_row();
    guard::ensure(db, budget, &mut exec).await?;
    let replace = on_conflict == OnConflict::ReplaceIfQueued;
    // Every retry keeps the id: an attempt lost with its connection may have
    // committed the row, and then the retry finds it instead of inserting another.
    let mut retrying = Retrying::new(db, budget, "find_or_enqueue");
    let outcome = loop {
        let after_lost_attempt = retrying.after_lost_attempt();
        let attempt = async {
            // One connection for the attempt's statements (a hit is two on MySQL and
            // SQLite): one acquire instead of one per statement, each a boxed future
            // sqlx makes large. It goes back to the pool when the attempt ends, lost
            // or not, so a retry starts on another.
            let mut exec = Executor::on(db)?;
            exec.hold().await?;
            if after_lost_attempt && let Some(stored) = exec.by_id(row.id).await? {
                tracing::info!(task_id = %stored.id, key = %key_of(&row), "the lost attempt had created the task");
                return Ok(Enqueued::Existing(stored));
            }
            enqueue(&mut exec, replace, &mut row).await
        };
        // Not boxed: with sqlx's acquire boxed where it runs (executor/conn.rs), the
        // attempt's future is under 1 KB, and copying it costs less than a box.
        if let Some(outcome) = retrying.run(attempt).await {
            break outcome;
        }
    };
    // On a pool, a database that kept aborting the insert is contention on the key.
    let outcome = outcome.map_err(|err| match err {
        DedupError::TransactionAborted(_) if !exec.in_transaction() => DedupError::Contention {
            key: key_of(&row).to_key(),
            attempts: MAX_ENQUEUE_ATTEMPTS,
        },
        err => err,
    });
    match &outcome {
        Ok(enqueued) => metrics::enqueued(enqueued.outcome_name(), 1),
        Err(DedupError::Contention { .. }) => metrics::contention(),
        Err(_) => {}
    }
    if let Ok(Enqueued::Created(task) | Enqueued::Replaced(task)) = &outcome
        && task.run_at <= task_run::now()
    {
        notify::task_due(&mut exec).await?;
    }
    outcome
}

/// Insert first, read on conflict: the body of `find_or_enqueue`, one attempt. Inserts
/// again (with a fresh id) when the task holding the key let go of it before it could be
/// read.
///
/// On PostgreSQL a key seen recently ([`Hot`]) is expected to be a hit, and goes through
/// the statement that inserts or returns the holder: one round trip for a hit. Other
/// keys take the plain insert, the faster statement for a create.
async fn enqueue(
    exec: &mut Executor<'_>,
    replace: bool,
    row: &mut task_run::Model,
) -> Result<Enqueued, DedupError> {
    let hot =
        (!replace && exec.finds_in_insert()).then(|| Hot::of(key_of(row).0, row.dedup_window_end));
    let outcome = insert_or_read(exec, replace, row, hot.is_some_and(Hot::is_hot)).await;
    if let (Some(hot), Ok(Enqueued::Created(_) | Enqueued::Existing(_))) = (hot, &outcome) {
        hot.seen();
    }
    outcome
}

/// [`enqueue`]'s attempts: with `find`, the insert that returns the holder.
async fn insert_or_read(
    exec: &mut Executor<'_>,
    replace: bool,
    row: &mut task_run::Model,
    find: bool,
) -> Result<Enqueued, DedupError> {
    for attempt in 1..=MAX_ENQUEUE_ATTEMPTS {
        let inserted = if find {
            exec.insert_or_find(row).await?
        } else if attempt > 1 && !replace {
            exec.insert_then_read(row).await?
        } else {
            exec.insert(row, replace).await?
        };
        match inserted {
            Inserted::Created => {
                tracing::debug!(task_id = %row.id, key = %key_of(row), attempt, "task created");
                return Ok(Enqueued::Created(row.clone()));
            }
            Inserted::Replaced(task) => {
                tracing::debug!(task_id = %task.id, key = %key_of(row), attempt, "queued task replaced");
                return Ok(Enqueued::Replaced(*task));
            }
            Inserted::Existing(existing) => {
                tracing::debug!(task_id = %existing.id, key = %key_of(row), attempt, "existing task returned");
                return Ok(Enqueued::Existing(*existing));
            }
            // The race path of `insert_or_find`: the holder committed after the
            // statement's snapshot was taken. A statement of its own sees it.
            Inserted::Held => {}
        }
        match exec
            .find_occupant(key_of(row).0, row.dedup_window_end, true)
            .await?
        {
            Some(existing) => {
                tracing::debug!(task_id = %existing.id, key = %key_of(row), attempt, "existing task returned");
                return Ok(Enqueued::Existing(existing));
            }
            None => {
                tracing::debug!(key = %key_of(row), attempt, "the task holding the key let go before it was read; retrying");
                // A fresh id, in case what conflicted was the id itself (SQLite's
                // untargeted ON CONFLICT covers the primary key too).
                row.id = Uuid::now_v7();
            }
        }
    }
    tracing::warn!(key = %key_of(row), attempts = MAX_ENQUEUE_ATTEMPTS, "gave up: contention");
    Err(DedupError::Contention {
        key: key_of(row).to_key(),
        attempts: MAX_ENQUEUE_ATTEMPTS,
    })
}

/// The key of the row being enqueued, borrowed from it: the row holds the key's strings.
fn key_of(row: &task_run::Model) -> KeyParts<'_> {
    KeyParts([&row.user_id, &row.task_type, &row.resource_key])
}
