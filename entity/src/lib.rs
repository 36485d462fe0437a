//! The `task_run` entity of [task-dedup](https://docs.rs/task-dedup) and its [`TaskStatus`].
//!
//! One row is one task. A task *holds* its key `(user_id, task_type, resource_key)`
//! according to the [`TaskScope`] it was created with: while it is `queued` or `running`
//! (the default), only while `queued`, or for a period window whatever its status. At
//! most one row holds a key at a time; the database enforces that with the
//! `task_active_resource_uidx` index created by `task-dedup-migration`.
//!
//! [`occupies_key_sql!`] is the single definition of "holds its key" in SQL: the index
//! predicate, the MySQL generated column, the `ON CONFLICT` target and every lookup use
//! its text, so they cannot disagree. [`active_status_sql`] is "queued or running".
//!
//! One run per key: at most one task of a key is `running` at a time, tasks created
//! [`concurrent`](task_run::Model::concurrent) aside; the `task_running_resource_uidx`
//! index enforces it and [`runs_serially_sql!`] is its predicate.

pub mod prelude;
mod scope;
mod status;
pub mod task_run;

pub use scope::{OCCUPIES_KEY_SQL, RUNS_SERIALLY_SQL, TaskScope};
pub use status::{TaskStatus, active_status_sql};
