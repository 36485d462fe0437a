//! task-dedup as the background queue of a [Loco](https://loco.rs) application.
//!
//! Every `perform_later` becomes `find_or_enqueue`: a job whose class and arguments (or
//! the key its class reads from them, [`Dedup`]) match a job still in flight is not
//! enqueued again, and Loco gets that job's id back. The workers the application
//! registers run on task-dedup's [`Worker`](task_dedup::Worker): retries with backoff,
//! leases and the reaper, one run per key at a time, wake-ups within milliseconds on
//! PostgreSQL (LISTEN/NOTIFY) and SQLite, batched endings, retention, pause. It works
//! on SQLite, PostgreSQL and MySQL/MariaDB, the last being a queue Loco itself does not
//! offer.
//!
//! The application's `Hooks::after_context`:
//!
//! ```no_run
//! use loco_rs::app::AppContext;
//! use task_dedup_loco::TaskDedupQueue;
//!
//! async fn after_context(ctx: AppContext) -> loco_rs::Result<AppContext> {
//!     let queue = TaskDedupQueue::builder(ctx.db.clone())
//!         .worker(|worker| worker.concurrency(8))
//!         .build();
//!     Ok(queue.install(ctx))
//! }
//! ```
//!
//! and task-dedup's migrations appended to its own migrator (`migration/src/lib.rs`):
//!
//! ```ignore
//! fn migrations() -> Vec<Box<dyn MigrationTrait>> {
//!     let mut migrations: Vec<Box<dyn MigrationTrait>> = vec![Box::new(m20220101_000001_users::Migration)];
//!     migrations.extend(task_dedup_migration::migrations());
//!     migrations
//! }
//! ```
//!
//! The README of this crate has the steps, the mapping of Loco's fields, and how to
//! enqueue in the request's transaction ([`TaskDedupQueue::enqueue`]).

mod error;
mod jobs;
mod keys;
mod provider;
mod registry;
mod start;

pub use error::QueueError;
pub use jobs::ENVELOPE;
pub use keys::{ARGS_KEY_PREFIX, DEFAULT_USER_ID, Dedup, JobKey, UNIQUE_KEY_PREFIX, args_key};
pub use provider::{TaskDedupQueue, TaskDedupQueueBuilder};
