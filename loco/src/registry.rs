//! What the provider knows of each worker class: its dedup rule, its tags, and, in a
//! process that runs it, Loco's erased handler; and the task-dedup [`Handler`] that
//! dispatches a claimed task to its class's handler.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use loco_rs::bgworker::JobHandler;
use task_dedup::{Handler, HandlerError, task_run};
use tokio_util::sync::CancellationToken;

use crate::jobs;
use crate::keys::Dedup;

#[derive(Default)]
struct Class {
    dedup: Option<Dedup>,
    tags: Option<Vec<String>>,
    handler: Option<Arc<JobHandler>>,
}

/// The classes, shared by the provider and its worker's handler.
#[derive(Default)]
pub(crate) struct Registry {
    classes: RwLock<HashMap<String, Class>>,
    default_dedup: Dedup,
}

impl Registry {
    pub(crate) fn new(default_dedup: Dedup) -> Registry {
        Registry {
            classes: RwLock::default(),
            default_dedup,
        }
    }

    // A panic elsewhere while the lock was held leaves the map as it was: every write
    // below is one insert, so the map is never half-changed.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Class>> {
        self.classes.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Class>> {
        self.classes.write().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn declare(&self, class: String, dedup: Option<Dedup>, tags: Vec<String>) {
        let mut classes = self.write();
        let entry = classes.entry(class).or_default();
        if dedup.is_some() {
            entry.dedup = dedup;
        }
        entry.tags = Some(tags);
    }

    pub(crate) fn register(&self, class: String, handler: JobHandler) {
        self.write().entry(class).or_default().handler = Some(Arc::new(handler));
    }

    pub(crate) fn dedup(&self, class: &str) -> Dedup {
        self.read()
            .get(class)
            .and_then(|c| c.dedup.clone())
            .unwrap_or_else(|| self.default_dedup.clone())
    }

    /// Loco passes a class's tags (`BackgroundWorker::tags()`) on every enqueue: a
    /// process that enqueues learns them, one that only runs is told by `declare`.
    pub(crate) fn saw_tags(&self, class: &str, tags: Option<&[String]>) {
        let known = self
            .read()
            .get(class)
            .is_some_and(|c| c.tags.as_deref() == Some(tags.unwrap_or(&[])));
        if !known {
            self.write().entry(class.to_owned()).or_default().tags =
                Some(tags.unwrap_or(&[]).to_vec());
        }
    }

    /// Every class this process knows (registered, declared or enqueued).
    pub(crate) fn classes(&self) -> Vec<String> {
        let mut classes: Vec<String> = self.read().keys().cloned().collect();
        classes.sort_unstable();
        classes
    }

    /// The registered classes a worker run with `tags` takes, as Loco's queues choose
    /// jobs: without tags, the classes without tags; with tags, the classes carrying at
    /// least one of them. A class whose tags are unknown counts as untagged.
    pub(crate) fn runnable(&self, tags: &[String]) -> Vec<String> {
        let mut classes: Vec<String> = self
            .read()
            .iter()
            .filter(|(_, class)| class.handler.is_some())
            .filter(|(_, class)| {
                let own = class.tags.as_deref().unwrap_or(&[]);
                if tags.is_empty() {
                    own.is_empty()
                } else {
                    own.iter().any(|tag| tags.contains(tag))
                }
            })
            .map(|(name, _)| name.clone())
            .collect();
        classes.sort_unstable();
        classes
    }

    fn handler(&self, class: &str) -> Option<Arc<JobHandler>> {
        self.read().get(class).and_then(|c| c.handler.clone())
    }
}

/// Runs a claimed task through its class's Loco handler.
pub(crate) struct Dispatch(pub(crate) Arc<Registry>);

#[async_trait]
impl Handler for Dispatch {
    async fn handle(
        &self,
        task: task_run::Model,
        _cancel: CancellationToken,
    ) -> Result<Option<serde_json::Value>, HandlerError> {
        // The worker claims only registered classes; a miss is a registration that
        // raced the claim, worth another attempt.
        let handler = self.0.handler(&task.task_type).ok_or_else(|| {
            HandlerError::retry(format!(
                "no handler for worker class {} in this process",
                task.task_type
            ))
        })?;
        let args = jobs::args(task.payload.as_ref()).cloned().ok_or_else(|| {
            HandlerError::fail(format!(
                "task {} of type {} is not a Loco job: its payload has no `{}.args`",
                task.id,
                task.task_type,
                jobs::ENVELOPE
            ))
        })?;
        // Loco handlers take no cancellation token: the worker's cancel grace drops one
        // that outlives its task's cancel.
        match handler(task.id.to_string(), args).await {
            Ok(()) => Ok(None),
            Err(err) if is_decode_error(&err) => Err(HandlerError::fail(format!(
                "the arguments do not decode into {}'s type: {err}",
                task.task_type
            ))),
            Err(err) => Err(HandlerError::retry(err)),
        }
    }
}

/// Loco's erased handler decodes the arguments first and returns its serde error as
/// `Error::JSON` (inside `WithBacktrace` when backtraces are on): no attempt decodes
/// them better, so the task fails at once.
fn is_decode_error(err: &loco_rs::Error) -> bool {
    match err {
        loco_rs::Error::JSON(_) => true,
        loco_rs::Error::WithBacktrace { inner, .. } => is_decode_error(inner),
        _ => false,
    }
}
