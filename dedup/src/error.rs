//! [`DedupError`], the one error type of the crate, and the classification of driver
//! errors that the rest of the crate relies on.

use std::fmt;

use sea_orm::DbErr;
use uuid::Uuid;

use crate::TaskStatus;
use crate::key::TaskKey;

/// Everything that can go wrong in task-dedup.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DedupError {
    /// A part of a [`TaskKey`] is empty, too long or contains a NUL byte. Raised by
    /// [`TaskKey::new`], before any SQL runs.
    #[error("invalid {field}: {reason}")]
    InvalidKey {
        /// The offending part of the key.
        field: KeyField,
        /// What is wrong with it.
        reason: InvalidReason,
    },
    /// Another argument is out of range (an empty worker id, a zero lease, ...). Raised
    /// before any SQL runs.
    #[error("invalid {name}: {reason}")]
    InvalidArgument {
        /// The argument's name.
        name: &'static str,
        /// What is wrong with it.
        reason: InvalidReason,
    },
    /// An item of a batch (`find_or_enqueue_many`) is invalid: its payload or scope (its
    /// key was checked by [`TaskKey::new`]). Raised before any SQL runs: nothing of the
    /// batch was written.
    #[error("item {index} of the batch: {source}")]
    InvalidItem {
        /// The item's position in the input.
        index: usize,
        /// What is wrong with it.
        source: Box<DedupError>,
    },
    /// `find_or_enqueue` hit the unique index, but the conflicting task had left the
    /// active set before it could be read, on every attempt; or, on a plain connection,
    /// the database kept aborting the insert to resolve deadlocks. Only a storm of tasks
    /// finishing on this very key causes it; retrying later is safe.
    #[error("gave up on key {key} after {attempts} attempts: the active task kept changing")]
    Contention {
        /// The key that was contended.
        key: TaskKey,
        /// How many inserts were tried.
        attempts: u32,
    },
    /// The database aborted the caller's transaction to resolve a deadlock or a
    /// serialization conflict (SQLSTATE 40001 / 40P01). Nothing of the transaction is
    /// left: roll it back and run it again. Outside a transaction these are retried.
    #[error(
        "the database aborted the transaction (deadlock or serialization failure); roll back and retry it"
    )]
    TransactionAborted(#[source] DbErr),
    /// No task has this id.
    #[error("task {id} not found")]
    NotFound {
        /// The id that was asked for.
        id: Uuid,
    },
    /// The task is not in a state the transition applies to (completing a task that is
    /// not running, cancelling a finished one, heartbeating a task the reaper requeued).
    /// The row is unchanged.
    #[error("cannot {transition} task {id}: it is {status}")]
    InvalidTransition {
        /// The task.
        id: Uuid,
        /// What was attempted.
        transition: Transition,
        /// The state the task is actually in.
        status: TaskStatus,
    },
    /// The task is running, but under another worker's lease (it was reaped and claimed
    /// again). The row is unchanged.
    #[error(
        "cannot {transition} task {id}: worker {worker_id:?} does not hold its lease (held by {holder:?})"
    )]
    LeaseNotHeld {
        /// The task.
        id: Uuid,
        /// What was attempted.
        transition: Transition,
        /// The worker that asked.
        worker_id: String,
        /// The worker that holds the lease.
        holder: Option<String>,
    },
    /// The connection was lost or could not be had: the server terminated the session,
    /// restarted or refused connections, the network reset it
    /// ([`is_connection_lost`](crate::is_connection_lost) says which errors count).
    ///
    /// On a pool, `find_or_enqueue`, `find_active` and the worker transitions retry on a
    /// fresh connection first, within their retry budget; this is what is left when the
    /// budget ran out. Inside the caller's transaction nothing is retried: the
    /// transaction is gone with its connection, and only the caller can run it again.
    /// Whether a write of the lost attempt took effect is unknown; running the same call
    /// again is safe (it returns what the first one stored).
    #[error("lost the database connection: {0}")]
    ConnectionLost(#[source] DbErr),
    /// The database gave up waiting: a lock wait or statement timeout (PostgreSQL
    /// `lock_timeout`/`statement_timeout`, MySQL/MariaDB `innodb_lock_wait_timeout`,
    /// SQLite's busy timeout). The statement wrote nothing; on PostgreSQL the caller's
    /// transaction is aborted. Not retried by the library: the limit is the caller's.
    #[error("the database timed out: {0}")]
    Timeout(#[source] DbErr),
    /// Any other database error, including a pool timeout.
    #[error(transparent)]
    Database(DbErr),
}

impl From<DbErr> for DedupError {
    /// Classifies the error: [`ConnectionLost`](DedupError::ConnectionLost),
    /// [`Timeout`](DedupError::Timeout),
    /// [`TransactionAborted`](DedupError::TransactionAborted), or else
    /// [`Database`](DedupError::Database).
    fn from(err: DbErr) -> DedupError {
        if crate::dialect::is_connection_lost(&err) {
            DedupError::ConnectionLost(err)
        } else if crate::dialect::is_transaction_conflict(&err) {
            DedupError::TransactionAborted(err)
        } else if crate::dialect::is_timeout(&err) {
            DedupError::Timeout(err)
        } else {
            DedupError::Database(err)
        }
    }
}

impl DedupError {
    /// Whether running the same operation again (for [`TransactionAborted`] and, in a
    /// transaction, [`ConnectionLost`], the whole transaction) may succeed:
    /// [`Contention`], [`TransactionAborted`] and [`ConnectionLost`].
    ///
    /// [`Contention`]: DedupError::Contention
    /// [`TransactionAborted`]: DedupError::TransactionAborted
    /// [`ConnectionLost`]: DedupError::ConnectionLost
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            DedupError::Contention { .. }
                | DedupError::TransactionAborted(_)
                | DedupError::ConnectionLost(_)
        )
    }

    /// Whether the connection was lost ([`DedupError::ConnectionLost`]).
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, DedupError::ConnectionLost(_))
    }
}

/// A part of a [`TaskKey`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyField {
    /// `user_id`.
    UserId,
    /// `task_type`.
    TaskType,
    /// `resource_key`.
    ResourceKey,
}

impl KeyField {
    /// The column name.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyField::UserId => "user_id",
            KeyField::TaskType => "task_type",
            KeyField::ResourceKey => "resource_key",
        }
    }
}

impl fmt::Display for KeyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an input was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidReason {
    /// The string is empty.
    Empty,
    /// The string has more characters than its column holds.
    TooLong {
        /// The limit, in characters.
        max_chars: usize,
        /// The string's length, in characters.
        chars: usize,
    },
    /// The string contains a NUL byte, which PostgreSQL cannot store in text.
    ContainsNul,
    /// A number or duration outside what the operation accepts.
    OutOfRange(&'static str),
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidReason::Empty => f.write_str("must not be empty"),
            InvalidReason::TooLong { max_chars, chars } => {
                write!(f, "{chars} characters, at most {max_chars} allowed")
            }
            InvalidReason::ContainsNul => f.write_str("must not contain NUL bytes"),
            InvalidReason::OutOfRange(expected) => write!(f, "out of range: {expected}"),
        }
    }
}

/// A lifecycle transition, as named in [`DedupError::InvalidTransition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// `heartbeat`: extend a running task's lease.
    Heartbeat,
    /// `complete`: running → succeeded.
    Complete,
    /// `fail`: running → failed.
    Fail,
    /// `cancel`: queued or running → cancelled.
    Cancel,
    /// `release`: running → queued, the attempt not counted.
    Release,
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transition::Heartbeat => "heartbeat",
            Transition::Complete => "complete",
            Transition::Fail => "fail",
            Transition::Cancel => "cancel",
            Transition::Release => "release",
        })
    }
}
