//! Typed tasks: the [`Task`] trait a serde type implements to name its task type, derive
//! its [`TaskKey`] from its fields and carry its default policies ([`TaskOptions`]), and
//! the conversions between such a value and what is stored ([`NewTask::from_task`],
//! [`Enqueued::decode`](crate::Enqueued::decode), [`decode`]).
//!
//! The typed API is a layer over the untyped one: a typed enqueue is a
//! [`find_or_enqueue`](crate::TaskDedup::find_or_enqueue) of the [`NewTask`] the value
//! describes, with the same outcomes and guarantees.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::values::backoff::RetryPolicy;
use crate::values::error::DedupError;
use crate::values::key::TaskKey;
use crate::values::task::{NewTask, OnConflict, Scope};
use task_dedup_entity::task_run;

/// A task type as a Rust type: its values are the payloads, stored as JSON.
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use task_dedup::{Scope, Task, TaskOptions};
///
/// #[derive(Serialize, Deserialize)]
/// struct RenderPdf {
///     user: String,
///     document_id: i64,
///     revision: u32,
/// }
///
/// impl Task for RenderPdf {
///     const TASK_TYPE: &'static str = "render-pdf";
///
///     fn user_id(&self) -> Option<String> {
///         Some(self.user.clone())
///     }
///
///     fn resource_key(&self) -> String {
///         format!("document/{}", self.document_id)
///     }
///
///     fn options() -> TaskOptions {
///         TaskOptions::default().scope(Scope::Queued)
///     }
/// }
/// ```
///
/// Enqueue it with [`TaskDedup::enqueue`](crate::TaskDedup::enqueue) (or
/// [`NewTask::from_task`] to change a policy for one call), run it with
/// [`WorkerBuilder::register`](crate::WorkerBuilder::register).
pub trait Task: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The task type, stored in `task_type` (1 to 64 characters, no NUL byte): what the
    /// worker routes on. Changing it orphans the tasks already stored under the old name.
    const TASK_TYPE: &'static str;

    /// The resource this task is about (`resource_key`): with the user and the type, the
    /// key that at most one active task holds.
    fn resource_key(&self) -> String;

    /// The user the task belongs to (`user_id`), or `None` (the default) for a key of no
    /// user ([`TaskKey::without_user`]).
    fn user_id(&self) -> Option<String> {
        None
    }

    /// The policies of this type: how it is enqueued (scope, conflict policy, priority,
    /// one run per key) and run (retries, lease, concurrency limit). Default:
    /// [`TaskOptions::default`].
    fn options() -> TaskOptions {
        TaskOptions::default()
    }
}

/// The default policies of a [`Task`] type. Those of enqueueing can be changed per call
/// on the [`NewTask`] ([`NewTask::from_task`]); those of running, per worker
/// ([`WorkerBuilder::task_type_concurrency`](crate::WorkerBuilder::task_type_concurrency)).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TaskOptions {
    /// Which states hold the key. Default [`Scope::Active`].
    pub scope: Scope,
    /// What a hit does. Default [`OnConflict::ReturnExisting`].
    pub on_conflict: OnConflict,
    /// Higher is claimed first. Default 0.
    pub priority: i16,
    /// The opt-out of one run per key ([`NewTask::concurrent`]). Default `false`.
    pub concurrent: bool,
    /// Retries of failed attempts. Default: the worker's
    /// [`retry_policy`](crate::WorkerBuilder::retry_policy).
    pub retry: Option<RetryPolicy>,
    /// The lease each heartbeat renews. Default: the worker's
    /// [`lease`](crate::WorkerBuilder::lease).
    pub lease: Option<Duration>,
    /// At most this many tasks of the type run at once in one worker. Default: no limit
    /// but the worker's concurrency.
    pub concurrency: Option<usize>,
    /// How long the type's handler may run before its attempt times out (its `cancel`
    /// fires, then the cancel grace; retried as the retry policy says). Default: the
    /// worker's [`timeout`](crate::WorkerBuilder::timeout);
    /// [`task_type_timeout`](crate::WorkerBuilder::task_type_timeout) overrides it.
    pub timeout: Option<Duration>,
}

impl TaskOptions {
    /// [`TaskOptions::scope`].
    #[must_use]
    pub fn scope(mut self, scope: Scope) -> TaskOptions {
        self.scope = scope;
        self
    }

    /// [`TaskOptions::on_conflict`].
    #[must_use]
    pub fn on_conflict(mut self, on_conflict: OnConflict) -> TaskOptions {
        self.on_conflict = on_conflict;
        self
    }

    /// [`TaskOptions::priority`].
    #[must_use]
    pub fn priority(mut self, priority: i16) -> TaskOptions {
        self.priority = priority;
        self
    }

    /// [`TaskOptions::concurrent`].
    #[must_use]
    pub fn concurrent(mut self, concurrent: bool) -> TaskOptions {
        self.concurrent = concurrent;
        self
    }

    /// [`TaskOptions::retry`].
    #[must_use]
    pub fn retry(mut self, policy: RetryPolicy) -> TaskOptions {
        self.retry = Some(policy);
        self
    }

    /// [`TaskOptions::lease`].
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> TaskOptions {
        self.lease = Some(lease);
        self
    }

    /// [`TaskOptions::concurrency`].
    #[must_use]
    pub fn concurrency(mut self, limit: usize) -> TaskOptions {
        self.concurrency = Some(limit);
        self
    }

    /// [`TaskOptions::timeout`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> TaskOptions {
        self.timeout = Some(timeout);
        self
    }
}

impl NewTask {
    /// The task `task` describes: its key from [`Task::user_id`], [`Task::TASK_TYPE`] and
    /// [`Task::resource_key`], the value as its payload, and the type's
    /// [`options`](Task::options). Change a policy for this call with the builder
    /// methods, then enqueue it with
    /// [`find_or_enqueue`](crate::TaskDedup::find_or_enqueue):
    ///
    /// ```no_run
    /// # use serde::{Deserialize, Serialize};
    /// # use task_dedup::{NewTask, Task, TaskDedup};
    /// # #[derive(Serialize, Deserialize)]
    /// # struct Digest { team: u32 }
    /// # impl Task for Digest {
    /// #     const TASK_TYPE: &'static str = "digest";
    /// #     fn resource_key(&self) -> String { format!("team/{}", self.team) }
    /// # }
    /// # async fn f(db: sea_orm::DatabaseConnection) -> Result<(), task_dedup::DedupError> {
    /// let tonight = chrono::Utc::now() + std::time::Duration::from_secs(6 * 3_600);
    /// let task = NewTask::from_task(&Digest { team: 7 })?.run_at(tonight).priority(-1);
    /// db.find_or_enqueue(task).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`DedupError::InvalidKey`] for a key part that is empty, too long or has a NUL
    /// byte (the task type included); [`DedupError::Encode`] when the value does not
    /// serialize to JSON.
    pub fn from_task<T: Task>(task: &T) -> Result<NewTask, DedupError> {
        let resource_key = task.resource_key();
        let key = match task.user_id() {
            Some(user_id) => TaskKey::new(user_id, T::TASK_TYPE, resource_key)?,
            None => TaskKey::without_user(T::TASK_TYPE, resource_key)?,
        };
        let payload = serde_json::to_value(task).map_err(|source| DedupError::Encode {
            task_type: T::TASK_TYPE,
            rust_type: std::any::type_name::<T>(),
            source,
        })?;
        let options = T::options();
        Ok(NewTask::new(key)
            .with_payload(payload)
            .scope(options.scope)
            .on_conflict(options.on_conflict)
            .priority(options.priority)
            .concurrent(options.concurrent))
    }
}

/// The payload of a stored task as `T`.
///
/// # Errors
/// [`DedupError::Decode`] when the task is of another type, or its payload (`null` when
/// it has none) does not deserialize into `T`.
pub fn decode<T: Task>(task: &task_run::Model) -> Result<T, DedupError> {
    of_type::<T>(task)?;
    match &task.payload {
        Some(payload) => T::deserialize(payload),
        None => T::deserialize(serde_json::Value::Null),
    }
    .map_err(|source| decode_error::<T>(task, source))
}

/// [`decode`], moving the payload out of `task` (a worker's claimed task: no copy of
/// its strings).
#[cfg(feature = "worker")]
pub(crate) fn decode_payload<T: Task>(task: &mut task_run::Model) -> Result<T, DedupError> {
    of_type::<T>(task)?;
    let payload = task.payload.take().unwrap_or(serde_json::Value::Null);
    serde_json::from_value(payload).map_err(|source| decode_error::<T>(task, source))
}

fn of_type<T: Task>(task: &task_run::Model) -> Result<(), DedupError> {
    if task.task_type == T::TASK_TYPE {
        return Ok(());
    }
    let source = serde::de::Error::custom(format_args!(
        "the task is of type `{}`, not `{}`",
        task.task_type,
        T::TASK_TYPE
    ));
    Err(decode_error::<T>(task, source))
}

fn decode_error<T: Task>(task: &task_run::Model, source: serde_json::Error) -> DedupError {
    DedupError::Decode {
        id: task.id,
        task_type: task.task_type.clone(),
        rust_type: std::any::type_name::<T>(),
        source,
    }
}
