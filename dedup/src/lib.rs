//! Atomic, resource-scoped task deduplication for SeaORM applications.
//!
//! For every `(user_id, task_type, resource_key)` at most one task is *active*
//! (`queued` or `running`). A unique index enforces it on SQLite, PostgreSQL and
//! MySQL/MariaDB, and [`TaskDedup::find_or_enqueue`] returns either the task it created
//! or the one already in flight, even under a storm of concurrent requests.
//!
//! ```no_run
//! use task_dedup::{NewTask, TaskDedup, TaskKey};
//! use task_dedup_migration::{Migrator, MigratorTrait};
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
//! # Features
//!
//! | feature | default | what |
//! |---|---|---|
//! | `sqlite` | yes | SQLite, through sea-orm's `sqlx-sqlite` |
//! | `postgres` | yes | PostgreSQL, through sea-orm's `sqlx-postgres` |
//! | `mysql` | yes | MySQL/MariaDB, through sea-orm's `sqlx-mysql` |
//! | `worker` | yes | the [`Worker`] runtime (tokio's task spawning, tokio-util) |
//! | `metrics` | no | counters and histograms through the `metrics` facade |
//!
//! No feature picks a runtime or a TLS backend: the application's own sea-orm
//! dependency does. A database whose feature is off is a
//! [`DbErr::BackendNotSupported`](sea_orm::DbErr::BackendNotSupported) naming the
//! feature, at run time.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "task-dedup needs at least one database feature: `sqlite`, `postgres` or `mysql` \
     (with `default-features = false`, add the ones your application connects to)"
);

mod backoff;
mod bulk;
mod connect;
mod connection;
mod dialect;
mod enqueue;
mod error;
mod executor;
mod guard;
mod key;
mod lifecycle;
mod metrics;
mod notify;
mod retry;
mod task;
mod validate;
#[cfg(feature = "worker")]
mod worker;

pub use backoff::{Retry, RetryPolicy};
pub use connect::{DEFAULT_MAX_CONNECTIONS, SQLITE_BUSY_TIMEOUT, connect, connect_with};
pub use connection::{DEFAULT_RETRY_BUDGET, DedupConnection, WithRetryBudget};
pub use enqueue::{Enqueued, TaskDedup};
pub use error::{DedupError, Transition, is_connection_lost, is_timeout, is_transaction_conflict};
pub use key::{InvalidKey, KeyField, TaskKey};
pub use lifecycle::{ReapReport, TaskWorker};
pub use retry::MAX_ENQUEUE_ATTEMPTS;
pub use task::{NewTask, OnConflict, Scope};
pub use task_dedup_entity::{TaskStatus, task_run};
pub use validate::{InvalidReason, MAX_CLAIM, MAX_LEASE};
#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
pub use worker::{Handler, HandlerError, Wakeups, Worker, WorkerBuilder, WorkerReport};

/// task-dedup's migrations and `ensure_schema` (the crate `task-dedup-migration`), built
/// with this crate's database features: splice `task_dedup::migration::migrations()` into
/// your `Migrator`, and one feature choice per database covers the library and its schema.
#[cfg(feature = "migration")]
#[cfg_attr(docsrs, doc(cfg(feature = "migration")))]
pub use task_dedup_migration as migration;

/// tokio-util's cancellation token, which [`Worker::run`] and [`Handler`]s take: here so
/// that an application needs no `tokio-util` dependency of its own.
#[cfg(feature = "worker")]
#[cfg_attr(docsrs, doc(cfg(feature = "worker")))]
pub use tokio_util::sync::CancellationToken;
