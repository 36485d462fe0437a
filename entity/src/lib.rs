//! The `task_run` entity of [task-dedup](https://docs.rs/task-dedup) and its [`TaskStatus`].
//!
//! One row is one task. At most one row per `(user_id, task_type, resource_key)` is
//! *active* ([`TaskStatus::Queued`] or [`TaskStatus::Running`]); the database enforces
//! that with the `task_active_resource_uidx` index created by `task-dedup-migration`.
//!
//! [`active_status_sql`] is the single definition of "active" in SQL. The index
//! predicate, the MySQL marker column, the `ON CONFLICT` target and every lookup are
//! built from it, so they cannot disagree.

pub mod prelude;
mod status;
pub mod task_run;

pub use status::{TaskStatus, active_status_sql};
