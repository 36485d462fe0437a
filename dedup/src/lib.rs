//! Atomic, resource-scoped task deduplication for SeaORM applications.
//!
//! For every `(user_id, task_type, resource_key)` at most one task is *active*
//! (`queued` or `running`). A unique index enforces it on SQLite, PostgreSQL and
//! MySQL/MariaDB, and [`TaskDedup::find_or_enqueue`] returns either the task it created
//! or the one already in flight, even under a storm of concurrent requests.
//!
//! ```no_run
//! use task_dedup::migration::{Migrator, MigratorTrait};
//! use task_dedup::{NewTask, TaskDedup, TaskKey};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let db = task_dedup::connect("sqlite::memory:").await?;
//! Migrator::up(&db, None).await?;
//!
//! let key = TaskKey::new("user-1", "export", "report/2026-11")?;
//! let outcome = db.find_or_enqueue(NewTask::new(key)).await?;
//! println!("{} task {}", if outcome.is_created() { "created" } else { "existing" }, outcome.task().id);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Typed tasks
//!
//! A serde type that implements [`Task`] names its task type, derives its key from its
//! fields and carries its default policies ([`TaskOptions`]);
//! [`TaskDedup::enqueue`] enqueues it (the same `find_or_enqueue` underneath) and
//! [`WorkerBuilder::register`] runs it with a [`TaskHandler`] that receives the payload
//! decoded in a [`Job`]. The feature `testing` adds [`testing`]: run a worker's due tasks
//! inline, assert that a task is enqueued.
//!
//! # The guarantee
//!
//! [`find_or_enqueue`](TaskDedup::find_or_enqueue) inserts first and lets the unique
//! index `task_active_resource_uidx` decide; on a conflict it reads the task that holds
//! the key and returns it as [`Enqueued::Existing`]. Nothing is checked-then-inserted, so
//! of any number of concurrent callers exactly one gets [`Enqueued::Created`]. The index
//! comes from the migrations ([`migration`]); a `task_run` table without it is refused
//! before anything is written ([`DedupError::Unguarded`]), so it is never silently
//! unguarded. Keys are byte-exact on every dialect; [`TaskKey::without_user`] makes keys
//! that belong to no user.
//!
//! # Scopes and conflict policies
//!
//! Which of a task's states hold its key is its [`Scope`], chosen per task type:
//! - one-shot work (send this invoice): [`Scope::Active`], the default: queued or
//!   running;
//! - re-do on change (reindex a post after an edit): [`Scope::Queued`]: while one runs, a
//!   new request queues one follow-up, so the edit that arrived during the run is not
//!   lost;
//! - at most once per period (a digest): [`Scope::Period`].
//!
//! What a hit does is its [`OnConflict`]: return the task as stored (the default), or
//! [`OnConflict::ReplaceIfQueued`]: the latest request's payload wins while the task is
//! still queued. [`NewTask`] also carries `run_at`, a priority and a retry budget.
//!
//! # In your transaction
//!
//! Every operation runs on a pool ([`sea_orm::DatabaseConnection`]) or in the caller's
//! transaction ([`sea_orm::DatabaseTransaction`]): enqueue in the same transaction as the
//! write the task is about, and the task exists exactly when that write commits. A hit
//! never aborts the transaction, PostgreSQL included. Code generic over both takes
//! `C: `[`DedupConnection`]:
//!
//! ```
//! use sea_orm::DbErr;
//! use task_dedup::{DedupConnection, NewTask, TaskDedup, TaskKey};
//!
//! /// A service function of a SeaORM application: `?` takes task-dedup's errors into
//! /// `DbErr`, and it works on a pool or inside a transaction alike.
//! async fn reindex_post<C: DedupConnection>(db: &C, post_id: i32) -> Result<bool, DbErr> {
//!     let key = TaskKey::without_user("reindex", format!("post/{post_id}"))?;
//!     Ok(db.find_or_enqueue(NewTask::new(key)).await?.is_created())
//! }
//! ```
//!
//! # Running tasks
//!
//! A [`Worker`] (feature `worker`) claims due tasks up to its concurrency, runs your
//! [`Handler`] for each under a lease it keeps alive, completes, retries or fails what
//! the handler returns, reaps the leases of crashed workers, wakes up on new work, and
//! on shutdown hands back what it could not finish. Give it a pool of its own
//! ([`connect_with`]) so that its claims do not queue behind your requests. Under it,
//! [`TaskWorker`] has the primitives: `claim_many`, `heartbeat`, `complete`, `fail`,
//! `cancel`, `release`, `reap_expired`, `prune`; and [`TaskWorker::pause`] /
//! [`resume`](TaskWorker::resume) stop and restart the claims of a task type in every
//! worker.
//!
//! # Maintenance
//!
//! A worker prunes finished tasks by default ([`Retention`]: `succeeded` and `cancelled`
//! after 24 hours, `failed` after 7 days), in bounded batches, from every worker at once
//! without harm; a period-scoped task is kept until its window is over.
//!
//! # Periodic tasks
//!
//! [`WorkerBuilder::periodic`] enqueues a typed task at each tick of a [`Schedule`] (a
//! cron expression or a fixed interval, in UTC or a named time zone). No leader: every
//! worker that declares it enqueues each tick as a [`Scope::Period`] task whose window is
//! the tick's, and the unique index keeps one task per tick.
//!
//! # Seeing and steering the queue
//!
//! [`TaskAdmin`], on the same handles: [`list_tasks`](TaskAdmin::list_tasks) with a
//! [`TaskFilter`] (statuses, type, user, key prefix, creation time) in keyset pages
//! ([`Cursor`]), [`counts`](TaskAdmin::counts), [`throughput`](TaskAdmin::throughput),
//! [`oldest_queued`](TaskAdmin::oldest_queued); [`retry_task`](TaskAdmin::retry_task)
//! (the unique index decides: a task whose key another task holds is left as it is and
//! [`DedupError::KeyHeld`] names the holder), `cancel_task`, `delete_task`, and the same
//! in bulk by filter with a limit ([`BulkOutcome`]).
//!
//! # Errors
//!
//! One error type, [`DedupError`]; invalid input is rejected before any SQL runs. A lost
//! connection is retried on a pool within a retry budget
//! ([`TaskDedup::with_retry_budget`], [`NewTask::retry_budget`]); inside your
//! transaction it is yours to retry. `DedupError` converts into SeaORM's
//! [`DbErr`](sea_orm::DbErr) with `?`, a database failure staying SeaORM's own error.
//!
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `sqlite` | yes | SQLite, through sea-orm's `sqlx-sqlite` |
//! | `postgres` | yes | PostgreSQL, through sea-orm's `sqlx-postgres` |
//! | `mysql` | yes | MySQL/MariaDB, through sea-orm's `sqlx-mysql` |
//! | `worker` | yes | the [`Worker`] runtime (tokio's task spawning, tokio-util) and periodic tasks (croner, chrono-tz) |
//! | `migration` | yes | [`migration`]: the migrations, built with the same database features |
//! | `metrics` | no | counters and histograms through the `metrics` facade |
//!
//! No feature picks a runtime or a TLS backend: the application's own sea-orm
//! dependency does. Without any database feature the crate does not compile; a database
//! that SeaORM reaches but task-dedup was built without is an error from [`connect`]
//! naming the feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "task-dedup needs at least one database feature: `sqlite`, `postgres` or `mysql` \
     (with `default-features = false`, add the ones your application connects to)"
);

mod admin;
mod connect;
mod dialect;
mod enqueue;
mod executor;
mod lifecycle;
mod maintenance;
mod metrics;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod values;
#[cfg(feature = "worker")]
mod worker;

pub use admin::{
    BulkOutcome, Cursor, DEFAULT_COUNT_LIMIT, DEFAULT_PAGE_SIZE, ListTasks, MAX_ADMIN_BATCH,
    MAX_COUNT_LIMIT, MinuteCounts, OldestQueued, Order, Page, StatusCount, TaskAdmin, TaskFilter,
    Throughput,
};
pub use connect::retry::MAX_ENQUEUE_ATTEMPTS;
pub use connect::{
    DEFAULT_MAX_CONNECTIONS, PoolerMode, SQLITE_BUSY_TIMEOUT, connect, connect_with,
    connect_with_pooler,
};
pub use enqueue::TaskDedup;
pub use enqueue::outcome::Enqueued;
pub use lifecycle::{ReapReport, TaskWorker};
pub use maintenance::pause::PausedType;
pub use maintenance::retention::{MAX_PRUNE_BATCH, PruneReport, Retention};
pub use task_dedup_entity::{TaskStatus, task_run};
pub use values::backoff::{Retry, RetryPolicy};
pub use values::connection::{DEFAULT_RETRY_BUDGET, DedupConnection, WithRetryBudget};
pub use values::error::{
    DedupError, Transition, is_connection_lost, is_timeout, is_transaction_conflict,
};
pub use values::key::{InvalidKey, KeyField, TaskKey};
pub use values::task::{NewTask, OnConflict, Scope};
pub use values::typed::{Task, TaskOptions, decode};
pub use values::validate::{InvalidReason, MAX_CLAIM, MAX_END_BATCH, MAX_LEASE};
#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
pub use worker::{
    Handler, HandlerError, Job, Lease, TaskHandler, Wakeups, Worker, WorkerBuilder, WorkerReport,
};

/// task-dedup's migrations and `ensure_schema` (the crate `task-dedup-migration`), built
/// with this crate's database features: splice `task_dedup::migration::migrations()` into
/// your `Migrator`, and one feature choice per database covers the library and its schema.
#[cfg(feature = "migration")]
#[cfg_attr(docsrs, doc(cfg(feature = "migration")))]
pub use task_dedup_migration as migration;

/// The time zones of [`Schedule::in_tz`], re-exported so that the version matches.
#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
pub use chrono_tz;
#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
pub use maintenance::schedule::{MAX_CATCH_UP, Schedule, Zone};
/// tokio-util's cancellation token, which [`Worker::run`] and [`Handler`]s take: here so
/// that an application needs no `tokio-util` dependency of its own.
#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
pub use tokio_util::sync::CancellationToken;
