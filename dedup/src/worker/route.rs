//! Routing a claimed task to what runs it: the [`TaskHandler`] registered for its type
//! (decoding its payload and encoding the result), or the untyped [`Handler`].

use std::collections::HashMap;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::handler::{Handler, HandlerError};
use super::job::{Job, Lease};
use crate::values::backoff::RetryPolicy;
use crate::values::typed::{self, Task};
use task_dedup_entity::task_run;

/// Runs one claimed task of type `T`: receives the [`Job`] (payload decoded), returns a
/// result that is stored, serialized, as the task's `result` (`()` or `None` store
/// nothing), or a [`HandlerError`] as an untyped [`Handler`] does.
///
/// Any `async` closure or function from `Job<T>` is one:
///
/// ```
/// use serde::{Deserialize, Serialize};
/// use task_dedup::{HandlerError, Job, Task, TaskHandler};
///
/// #[derive(Serialize, Deserialize)]
/// struct Thumbnail { image_id: u64 }
///
/// impl Task for Thumbnail {
///     const TASK_TYPE: &'static str = "thumbnail";
///     fn resource_key(&self) -> String { format!("image/{}", self.image_id) }
/// }
///
/// #[derive(Serialize)]
/// struct Made { bytes: usize }
///
/// async fn thumbnail(job: Job<Thumbnail>) -> Result<Made, HandlerError> {
///     if job.args.image_id == 0 {
///         return Err(HandlerError::fail("no such image"));
///     }
///     Ok(Made { bytes: 1_024 })
/// }
/// fn takes(_: impl TaskHandler<Thumbnail>) {}
/// takes(thumbnail);
/// ```
pub trait TaskHandler<T: Task>: Send + Sync + 'static {
    /// What the handler returns on success.
    type Output: Serialize + Send + 'static;

    /// Runs one task.
    fn handle(
        &self,
        job: Job<T>,
    ) -> impl Future<Output = Result<Self::Output, HandlerError>> + Send;
}

impl<T, F, Fut, R> TaskHandler<T> for F
where
    T: Task,
    F: Fn(Job<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, HandlerError>> + Send,
    R: Serialize + Send + 'static,
{
    type Output = R;

    fn handle(&self, job: Job<T>) -> impl Future<Output = Result<R, HandlerError>> + Send {
        self(job)
    }
}

/// What a route needs of the worker to run one task.
pub(super) struct RunContext {
    pub cancel: CancellationToken,
    pub lease: Lease,
}

/// Runs a claimed task, whatever runs it.
#[async_trait]
pub(super) trait Route: Send + Sync {
    async fn run(
        &self,
        task: task_run::Model,
        context: RunContext,
    ) -> Result<Option<serde_json::Value>, HandlerError>;
}

/// The untyped handler: the task as stored.
pub(super) struct Untyped(pub Arc<dyn Handler>);

#[async_trait]
impl Route for Untyped {
    async fn run(
        &self,
        task: task_run::Model,
        context: RunContext,
    ) -> Result<Option<serde_json::Value>, HandlerError> {
        self.0.handle(task, context.cancel).await
    }
}

/// A [`TaskHandler`] of `T`.
pub(super) struct Typed<T, H> {
    handler: H,
    task: PhantomData<fn() -> T>,
}

impl<T, H> Typed<T, H> {
    pub(super) fn new(handler: H) -> Typed<T, H> {
        Typed {
            handler,
            task: PhantomData,
        }
    }
}

#[async_trait]
impl<T: Task, H: TaskHandler<T>> Route for Typed<T, H> {
    async fn run(
        &self,
        mut task: task_run::Model,
        context: RunContext,
    ) -> Result<Option<serde_json::Value>, HandlerError> {
        // A payload that does not decode will not decode on the next attempt either.
        let args = typed::decode_payload::<T>(&mut task).map_err(HandlerError::fail)?;
        let job = Job::new(args, task, context.cancel, context.lease);
        let output = self.handler.handle(job).await?;
        match serde_json::to_value(output) {
            Ok(serde_json::Value::Null) => Ok(None),
            Ok(result) => Ok(Some(result)),
            Err(err) => Err(HandlerError::retry(format_args!(
                "the result of task type `{}` ({}) does not serialize to JSON: {err}",
                T::TASK_TYPE,
                std::any::type_name::<H::Output>()
            ))),
        }
    }
}

/// How a type runs: its route and what it changes of the worker's settings.
pub(super) struct TypeRoute {
    pub route: Arc<dyn Route>,
    pub retry: RetryPolicy,
    pub lease: Duration,
    pub heartbeat_every: Duration,
    /// The type's own timeout ([`TaskOptions::timeout`](crate::TaskOptions::timeout)).
    pub timeout: Option<Duration>,
}

/// Every route of a worker.
pub(super) struct Routes {
    /// The registered types.
    pub typed: HashMap<String, TypeRoute>,
    /// The untyped handler, for every other type the worker claims.
    pub untyped: Option<Arc<dyn Route>>,
}

impl Routes {
    /// The route of `task_type`, if the worker has one.
    pub(super) fn get(&self, task_type: &str) -> Option<&Arc<dyn Route>> {
        match self.typed.get(task_type) {
            Some(typed) => Some(&typed.route),
            None => self.untyped.as_ref(),
        }
    }
}
