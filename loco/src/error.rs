//! [`QueueError`]: what the provider refuses or meets, and its way into Loco's error.

use task_dedup::{DedupError, InvalidKey};

/// What went wrong in the provider. Loco's `QueueProvider` methods return
/// `loco_rs::Error`; this travels inside it as `loco_rs::Error::Any`, so an application
/// can downcast to it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The database or task-dedup said no (its error says why: a lost connection past
    /// the retry budget, a missing unique index, ...).
    #[error(transparent)]
    Dedup(#[from] DedupError),
    /// A key part is empty or too long: a class name over 64 characters, a key
    /// function's resource key over 255, a user id over 64.
    #[error(transparent)]
    Key(#[from] InvalidKey),
    /// A [`Dedup::by_key`](crate::Dedup::by_key) function could not read the
    /// arguments it was given.
    #[error("the key of class {class} cannot be read from its arguments: {reason}")]
    KeyUnreadable {
        /// The worker class.
        class: String,
        /// The decoding error.
        reason: String,
    },
    /// A job id that is not a task id (a UUID).
    #[error("invalid job id {id:?}: job ids of this queue are task ids (UUIDs)")]
    InvalidJobId {
        /// What was given.
        id: String,
    },
    /// `run` found no registered worker class for its tags: nothing would ever be
    /// claimed.
    #[error(
        "no registered worker class runs with tags {tags:?}: register the workers (Hooks::connect_workers) \
         and, for tagged classes, declare them with TaskDedupQueueBuilder::class"
    )]
    NothingToRun {
        /// The tags `run` was given.
        tags: Vec<String>,
    },
}

impl From<QueueError> for loco_rs::Error {
    fn from(err: QueueError) -> loco_rs::Error {
        loco_rs::Error::Any(Box::new(err))
    }
}

/// `?` on task-dedup's own calls inside a `QueueProvider` method.
pub(crate) fn loco(err: impl Into<QueueError>) -> loco_rs::Error {
    err.into().into()
}
