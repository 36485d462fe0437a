//! Helpers for an application's own tests (feature `testing`): run the due tasks of a
//! worker's types inline and see what happened ([`drain`], as Oban.Testing's
//! `drain_queue` and River's `rivertest` do), find or assert a typed task in the queue
//! ([`enqueued`], [`assert_enqueued`]), and an in-memory SQLite database with the schema
//! ([`sqlite_memory`]).
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use task_dedup::{HandlerError, Job, Task, TaskDedup, Worker, testing};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Welcome { user: String }
//!
//! impl Task for Welcome {
//!     const TASK_TYPE: &'static str = "welcome-mail";
//!     fn resource_key(&self) -> String { format!("user/{}", self.user) }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let db = testing::sqlite_memory().await?;
//! db.enqueue(&Welcome { user: "ada".into() }).await?;
//! let (_, task) = testing::assert_enqueued::<Welcome, _>(&db, serde_json::json!({"user": "ada"})).await;
//! assert_eq!(task.user, "ada");
//!
//! let worker = Worker::builder(db.clone())
//!     .register::<Welcome>(|job: Job<Welcome>| async move { Ok::<_, HandlerError>(job.args.user.len()) })
//!     .build()?;
//! let drained = testing::drain(&worker).await?;
//! assert_eq!(drained.completed.len(), 1);
//! assert_eq!(drained.completed[0].result, Some(serde_json::json!(3)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder,
};

use crate::values::error::DedupError;
use crate::values::typed::{self, Task};
use crate::worker::Worker;
pub use crate::worker::drain::Drained;
use task_dedup_entity::task_run::{self, TaskStatus};

/// An in-memory SQLite database (one connection, which is the whole database) with
/// task-dedup's migrations applied.
///
/// # Errors
/// [`DedupError::Database`] if SQLite cannot open it or a migration fails.
pub async fn sqlite_memory() -> Result<DatabaseConnection, DedupError> {
    use task_dedup_migration::MigratorTrait;
    let db = crate::connect("sqlite::memory:").await?;
    task_dedup_migration::Migrator::up(&db, None).await?;
    Ok(db)
}

/// Runs the due tasks of `worker`'s types one at a time with their handlers, in the
/// caller's task (a panic in a handler is the test's), recording each end as the worker
/// would, until none is due: follow-ups that became due on the way included, tasks
/// scheduled later (`run_at`, a retry's backoff) not. Returns what happened to each.
///
/// # Errors
/// The database errors of claiming and recording.
pub async fn drain(worker: &Worker) -> Result<Drained, DedupError> {
    crate::worker::drain::drain(worker).await
}

/// The active (`queued` or `running`) tasks of type `T`, oldest first, each with its
/// payload decoded.
///
/// # Errors
/// [`DedupError::Decode`] for a payload that does not decode into `T`;
/// [`DedupError::Database`].
pub async fn enqueued<T: Task, C: ConnectionTrait>(
    db: &C,
) -> Result<Vec<(task_run::Model, T)>, DedupError> {
    let tasks = task_run::Entity::find()
        .filter(task_run::Column::TaskType.eq(T::TASK_TYPE))
        .filter(task_run::Column::Status.is_in([TaskStatus::Queued, TaskStatus::Running]))
        .order_by_asc(task_run::Column::CreatedAt)
        .order_by_asc(task_run::Column::Id)
        .all(db)
        .await?;
    tasks
        .into_iter()
        .map(|task| typed::decode::<T>(&task).map(|args| (task, args)))
        .collect()
}

/// The first active task of type `T` whose payload has every field of `fields` (a JSON
/// object, matched recursively: `{"user": "ada"}` matches `{"user": "ada", "plan":
/// "pro"}`; `{}` matches any), with its payload decoded.
///
/// # Panics
/// When there is none (it is an assertion): the message lists the active tasks of the
/// type; and on a database or decoding error.
pub async fn assert_enqueued<T: Task, C: ConnectionTrait>(
    db: &C,
    fields: serde_json::Value,
) -> (task_run::Model, T) {
    let active = match enqueued::<T, C>(db).await {
        Ok(active) => active,
        Err(err) => panic!("assert_enqueued::<{}>: {err}", std::any::type_name::<T>()),
    };
    let payloads: Vec<String> = active
        .iter()
        .map(|(task, _)| {
            task.payload
                .as_ref()
                .map_or("null".to_owned(), |p| p.to_string())
        })
        .collect();
    match active.into_iter().find(|(task, _)| {
        contains(
            task.payload.as_ref().unwrap_or(&serde_json::Value::Null),
            &fields,
        )
    }) {
        Some(found) => found,
        None => panic!(
            "no active task of type `{}` has the fields {fields}; the active ones: [{}]",
            T::TASK_TYPE,
            payloads.join(", ")
        ),
    }
}

/// Whether `value` has everything `fields` has: objects by their keys, recursively;
/// anything else equal.
fn contains(value: &serde_json::Value, fields: &serde_json::Value) -> bool {
    match (value, fields) {
        (serde_json::Value::Object(value), serde_json::Value::Object(fields)) => fields
            .iter()
            .all(|(name, field)| value.get(name).is_some_and(|v| contains(v, field))),
        _ => value == fields,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn fields_match_as_a_subset() {
        let payload = json!({"user": "ada", "plan": {"name": "pro", "seats": 3}});
        assert!(super::contains(&payload, &json!({})));
        assert!(super::contains(&payload, &json!({"user": "ada"})));
        assert!(super::contains(&payload, &json!({"plan": {"seats": 3}})));
        assert!(!super::contains(&payload, &json!({"user": "bob"})));
        assert!(!super::contains(&payload, &json!({"missing": null})));
        assert!(!super::contains(&payload, &json!({"plan": {"seats": 4}})));
    }
}
