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

mod bulk;
mod connect;
mod connection;
mod dialect;
mod enqueue;
mod error;
mod key;
mod metrics;
mod reconnect;
mod retry;
#[cfg(feature = "worker")]
mod runtime;
mod task;
mod validate;
mod wakeup;
mod worker;

pub use connect::{DEFAULT_MAX_CONNECTIONS, SQLITE_BUSY_TIMEOUT, connect, connect_with};
pub use connection::DedupConnection;
pub use dialect::{is_connection_lost, is_transaction_conflict};
pub use enqueue::{Enqueued, MAX_ENQUEUE_ATTEMPTS, TaskDedup};
pub use error::{DedupError, InvalidReason, KeyField, Transition};
pub use key::TaskKey;
pub use reconnect::{DEFAULT_RETRY_BUDGET, default_retry_budget, set_default_retry_budget};
pub use retry::{Retry, RetryPolicy};
#[cfg(feature = "worker")]
pub use runtime::{Handler, HandlerError, Wakeups, Worker, WorkerBuilder, WorkerReport};
pub use task::{NewTask, OnConflict, Scope};
pub use task_dedup_entity::{OCCUPIES_KEY_SQL, TaskScope, TaskStatus, active_status_sql, task_run};
pub use validate::{MAX_CLAIM, MAX_LEASE};
pub use worker::{ReapReport, TaskWorker};
