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
//! # The guarantee
//!
//! [`find_or_enqueue`](TaskDedup::find_or_enqueue) inserts first and lets the unique
//! index `task_active_resource_uidx` decide; on a conflict it reads the task that holds
//! the key and returns it as [`Enqueued::Existing`]. Nothing is checked-then-inserted, so
//! of any number of concurrent callers exactly one gets [`Enqueued::Created`]. The index
//! comes from the migrations ([`migration`]); a `task_run` table without it is refused
//! before anything is written ([`DedupError::Unguarded`]), so it is never silently
//! unguarded.
//!
//! Every operation runs on a pool or in the caller's transaction, so a task can be
//! enqueued in the same transaction as the write it is about (a hit never aborts it,
//! PostgreSQL included). Code generic over both takes `C: `[`DedupConnection`]:
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
//! # Where things are
//!
//! - Enqueueing: [`TaskDedup`] (`find_or_enqueue`, `find_or_enqueue_many`, typed
//!   `enqueue`), the task a call asks for ([`NewTask`], [`TaskKey`], [`Scope`],
//!   [`OnConflict`]) and typed tasks ([`Task`], [`TaskOptions`]).
//! - Running tasks: the [`Worker`] (feature `worker`) and its [`WorkerBuilder`],
//!   [`Handler`]s and typed [`TaskHandler`]s receiving a [`Job`]; under it the primitives
//!   of [`TaskLifecycle`] (claim, heartbeat, complete, fail, cancel, release, reap).
//! - Maintenance: [`Retention`], pause and resume of a task type ([`TaskLifecycle::pause`]),
//!   periodic tasks ([`WorkerBuilder::periodic`], [`Schedule`]).
//! - Seeing and steering the queue: [`TaskAdmin`] (lists, counts, retry, cancel, delete).
//! - Connecting: [`connect`], [`connect_with`], [`connect_with_pooler`]; errors:
//!   [`DedupError`], which converts into SeaORM's [`DbErr`](sea_orm::DbErr) with `?`.
//!
//! # The guide
//!
//! The [`guide`] explains each part with examples that run: [getting
//! started](guide::getting_started), [scopes and policies](guide::scopes_and_policies),
//! [typed tasks and the Worker](guide::typed_tasks_and_worker), [periodic tasks and
//! maintenance](guide::periodic_and_maintenance), [operating](guide::operating) (the
//! command, the dashboard, poolers), [upgrading](guide::upgrading) (online migrations included) and the [failure
//! model](guide::failure_model).
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

// The guide's links name `task_dedup::...`, so that the same chapters resolve here and in
// the workspace's root package, which runs their examples.
#[cfg(doc)]
extern crate self as task_dedup;

mod admin;
mod connect;
mod dialect;
mod enqueue;
mod executor;
// Rendered by rustdoc only; its examples run as the root package's doctests, which have
// the dev-dependencies they use (the migrator, the dashboard).
#[cfg(all(doc, not(doctest)))]
pub mod guide;
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
    DEFAULT_MAX_CONNECTIONS, SQLITE_BUSY_TIMEOUT, connect, connect_with, connect_with_pooler,
};
pub use enqueue::TaskDedup;
pub use enqueue::outcome::Enqueued;
/// The old name of [`TaskLifecycle`] (0.1): the lifecycle primitives were called
/// `TaskWorker` beside the [`Worker`] runtime, which said two things with one word.
/// Kept for a release; use `TaskLifecycle`. (Rust has no deprecation warning for a
/// re-exported trait.)
pub use lifecycle::TaskLifecycle as TaskWorker;
pub use lifecycle::{ReapReport, TaskLifecycle};
pub use maintenance::limits::{
    LimitedType, MAX_LIMIT, RATE_WINDOWS, RateLimit, TypeLimits, UserLimit,
};
pub use maintenance::pause::PausedType;
pub use maintenance::retention::{MAX_PRUNE_BATCH, PruneReport, Retention};
pub use task_dedup_entity::{TaskStatus, task_run};
pub use values::backoff::{Retry, RetryPolicy};
pub use values::connection::{
    DEFAULT_RETRY_BUDGET, DedupConnection, PoolerMode, WithPoolerMode, WithRetryBudget,
};
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
