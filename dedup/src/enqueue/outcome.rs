//! [`Enqueued`]: what a call to [`find_or_enqueue`](crate::TaskDedup::find_or_enqueue) did.

use crate::values::error::DedupError;
use crate::values::typed::Task;
use task_dedup_entity::task_run;

/// What [`TaskDedup::find_or_enqueue`](crate::TaskDedup::find_or_enqueue) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// This call inserted the task.
    Created(task_run::Model),
    /// Another task held the key; this is it, as stored. Nothing was written.
    Existing(task_run::Model),
    /// [`OnConflict::ReplaceIfQueued`](crate::OnConflict::ReplaceIfQueued): the queued task holding the key took this
    /// request's payload, `run_at` and priority; this is it as it is now stored. Its id,
    /// scope, attempts and creation time are its own.
    Replaced(task_run::Model),
}

impl Enqueued {
    /// The task, whatever happened.
    pub fn task(&self) -> &task_run::Model {
        match self {
            Enqueued::Created(task) | Enqueued::Existing(task) | Enqueued::Replaced(task) => task,
        }
    }

    /// The task, whatever happened.
    pub fn into_task(self) -> task_run::Model {
        match self {
            Enqueued::Created(task) | Enqueued::Existing(task) | Enqueued::Replaced(task) => task,
        }
    }

    /// Whether this call created the task.
    pub fn is_created(&self) -> bool {
        matches!(self, Enqueued::Created(_))
    }

    /// Whether this call replaced the payload of a queued task.
    pub fn is_replaced(&self) -> bool {
        matches!(self, Enqueued::Replaced(_))
    }

    /// The task's payload as `T`: what was stored, which on a hit is the holder's
    /// payload, not this call's.
    ///
    /// # Errors
    /// As [`decode`](crate::decode).
    pub fn decode<T: Task>(&self) -> Result<T, DedupError> {
        crate::values::typed::decode(self.task())
    }

    /// `created`, `existing` or `replaced`: the label of metrics and traces.
    pub(crate) fn outcome_name(&self) -> &'static str {
        match self {
            Enqueued::Created(_) => "created",
            Enqueued::Existing(_) => "existing",
            Enqueued::Replaced(_) => "replaced",
        }
    }
}
