//! [`DedupError`], the one error type of the crate. What a driver's error means is the
//! dialects' business ([`Kind`]); this module only names the outcomes.

use std::fmt;

use sea_orm::DbErr;
use uuid::Uuid;

use crate::dialect::{Failure, Kind};
use crate::values::key::{InvalidKey, KeyField, TaskKey};
use crate::values::validate::{InvalidArgument, InvalidReason};
use task_dedup_entity::TaskStatus;

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
    /// A [`Schedule`](crate::Schedule) given to
    /// [`WorkerBuilder::periodic`](crate::WorkerBuilder::periodic) is invalid: a cron
    /// expression that does not parse or never matches, an unknown time zone, an
    /// interval that is not whole seconds of at least one, a catch-up over
    /// [`MAX_CATCH_UP`](crate::MAX_CATCH_UP). Raised by
    /// [`WorkerBuilder::build`](crate::WorkerBuilder::build).
    #[error("invalid schedule `{expression}`: {reason}")]
    InvalidSchedule {
        /// The schedule as written (`0 * * * *`, `every 0s`), with its zone if it has one.
        expression: String,
        /// What is wrong with it.
        reason: String,
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
    /// An operator's retry ([`TaskAdmin::retry_task`](crate::TaskAdmin::retry_task))
    /// would have put the task back in the queue while another task holds its key: the
    /// unique index refused it, the task is unchanged, and `holder` is the task that
    /// holds the key (as read right after the refusal). Cancel or wait for the holder,
    /// or leave it: it does the work.
    #[error("cannot retry task {id}: its key is held by task {}", .holder.id)]
    KeyHeld {
        /// The task that was to be retried.
        id: Uuid,
        /// The task holding its key.
        holder: Box<task_dedup_entity::task_run::Model>,
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
    /// `task_run` exists but lacks the unique index the guarantee rests on (a table made
    /// from the entity, by hand or by an older release), so enqueueing would create
    /// duplicates; nothing was written. Run task-dedup's migrations
    /// (`task_dedup_migration::migrations()`) or `task_dedup_migration::ensure_schema`,
    /// which add it. Checked once per database before its first enqueue.
    #[error(
        "task_run is not guarded against duplicates ({problem}): run task-dedup's migrations \
         or task_dedup_migration::ensure_schema, which add the unique index \
         task_active_resource_uidx"
    )]
    Unguarded {
        /// What is missing or wrong.
        problem: String,
    },
    /// A [`Task`](crate::Task) value does not serialize to JSON (a map with keys that are
    /// not strings, a failing `Serialize` impl). Raised before any SQL runs.
    #[error("task type `{task_type}`: a {rust_type} does not serialize to JSON: {source}")]
    Encode {
        /// The task type.
        task_type: &'static str,
        /// The Rust type.
        rust_type: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored task's payload does not deserialize into the [`Task`](crate::Task) type
    /// asked for (an old shape, a hand-written payload, another type). A
    /// [`Worker`](crate::Worker) fails such a task for good with this message.
    #[error(
        "task {id} of type `{task_type}`: its payload does not decode into {rust_type}: {source}"
    )]
    Decode {
        /// The task.
        id: Uuid,
        /// The task's stored type.
        task_type: String,
        /// The Rust type asked for.
        rust_type: &'static str,
        /// serde_json's error.
        #[source]
        source: serde_json::Error,
    },
    /// A [`WorkerBuilder`](crate::WorkerBuilder) was given two handlers for one task type
    /// (two registrations, or a registration and the untyped handler's
    /// [`task_types`](crate::WorkerBuilder::task_types)).
    #[error("task type `{task_type}` has two handlers on this worker")]
    DuplicateTaskType {
        /// The task type.
        task_type: String,
    },
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
        Failure::from(err).into()
    }
}

impl From<Failure> for DedupError {
    /// The error as classified where it arose.
    fn from(Failure { kind, err }: Failure) -> DedupError {
        match kind {
            Kind::ConnectionLost => DedupError::ConnectionLost(err),
            Kind::TransactionConflict => DedupError::TransactionAborted(err),
            Kind::Timeout => DedupError::Timeout(err),
            Kind::HeldKey | Kind::RunningKey | Kind::SlotTaken | Kind::Other => {
                DedupError::Database(err)
            }
        }
    }
}

impl From<DedupError> for DbErr {
    /// For code whose error type is SeaORM's: a database failure is SeaORM's own error,
    /// unchanged (its variant, its driver error, [`DbErr::sql_err`] all as they were);
    /// a task that does not exist is [`DbErr::RecordNotFound`]; anything else task-dedup
    /// decided (an invalid key or argument, a refused transition, contention) is
    /// [`DbErr::Custom`] with the same message.
    ///
    /// ```no_run
    /// use sea_orm::{DatabaseConnection, DbErr};
    /// use task_dedup::{NewTask, TaskDedup, TaskKey};
    ///
    /// /// A service function in a SeaORM application: `?` takes task-dedup's errors.
    /// async fn reindex(db: &DatabaseConnection, post_id: i32) -> Result<bool, DbErr> {
    ///     let key = TaskKey::new("blog", "reindex", format!("post/{post_id}"))?;
    ///     let outcome = db.find_or_enqueue(NewTask::new(key)).await?;
    ///     Ok(outcome.is_created())
    /// }
    /// ```
    fn from(err: DedupError) -> DbErr {
        match err {
            DedupError::Database(err)
            | DedupError::ConnectionLost(err)
            | DedupError::Timeout(err)
            | DedupError::TransactionAborted(err) => err,
            err @ DedupError::NotFound { .. } => DbErr::RecordNotFound(err.to_string()),
            err => DbErr::Custom(err.to_string()),
        }
    }
}

impl From<InvalidKey> for DbErr {
    /// [`DbErr::Custom`] with the message, as through [`DedupError`].
    fn from(err: InvalidKey) -> DbErr {
        DedupError::from(err).into()
    }
}

impl From<InvalidKey> for DedupError {
    fn from(InvalidKey { field, reason }: InvalidKey) -> DedupError {
        DedupError::InvalidKey { field, reason }
    }
}

impl From<InvalidArgument> for DedupError {
    fn from(InvalidArgument { name, reason }: InvalidArgument) -> DedupError {
        DedupError::InvalidArgument { name, reason }
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

    /// Whether the database gave up waiting ([`DedupError::Timeout`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, DedupError::Timeout(_))
    }
}

/// A lifecycle transition, as named in [`DedupError::InvalidTransition`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
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
    /// `snooze`: running → queued after a delay, the attempt not counted.
    Snooze,
    /// `retry` (an operator's, [`TaskAdmin::retry_task`](crate::TaskAdmin::retry_task)):
    /// failed or cancelled → queued.
    Retry,
    /// `delete` ([`TaskAdmin::delete_task`](crate::TaskAdmin::delete_task)): a finished
    /// task removed.
    Delete,
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transition::Heartbeat => "heartbeat",
            Transition::Complete => "complete",
            Transition::Fail => "fail",
            Transition::Cancel => "cancel",
            Transition::Release => "release",
            Transition::Snooze => "snooze",
            Transition::Retry => "retry",
            Transition::Delete => "delete",
        })
    }
}

/// Whether the database aborted a statement to resolve a deadlock or a serialization
/// conflict: PostgreSQL SQLSTATE 40001 (serialization failure) or 40P01 (deadlock),
/// MySQL/MariaDB error 1213 (deadlock; SQLSTATE 40001). SQLite has neither: one writer
/// at a time.
///
/// Inside a transaction the whole transaction is gone (InnoDB rolls it back, PostgreSQL
/// refuses every further statement): roll it back and run it again from the start. Use
/// this on your own statements that share a transaction with `find_or_enqueue`; for
/// task-dedup's own errors see [`DedupError::is_retryable`].
pub fn is_transaction_conflict(err: &DbErr) -> bool {
    Kind::of(err) == Kind::TransactionConflict
}

/// Whether `err` means the connection was lost or could not be had, so that the same
/// statement may succeed on a fresh connection: an I/O error (reset, broken pipe, end of
/// stream, connection refused while a server restarts), a TLS failure mid-session, a
/// crashed SQLite worker, or a server saying so (PostgreSQL SQLSTATE class 08, 57P01
/// admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now; MySQL/MariaDB 2006
/// server gone, 2013 lost connection, 1927 connection killed, 1053 server shutdown, 4031
/// disconnected for inactivity, 1047 a MariaDB Galera node not ready: joining its
/// cluster or without quorum), or a pool that timed out waiting for a connection:
/// sqlx reports the timeout, not its cause, and a server that is down or being replaced
/// (a failover, a cluster node rejoining) times the pool out exactly as a pool whose
/// connections are all busy does; either can pass. A closed pool is not lost: the
/// application closed it.
///
/// Use it on your own statements; task-dedup's own errors say it with
/// [`DedupError::ConnectionLost`].
pub fn is_connection_lost(err: &DbErr) -> bool {
    Kind::of(err) == Kind::ConnectionLost
}

/// Whether the database gave up waiting: PostgreSQL 57014 (statement timeout, or a
/// cancel) and 55P03 (lock timeout), MySQL/MariaDB 1205 (lock wait timeout), 1969 and
/// 3024 (statement time limits), SQLite's busy timeout (SQLITE_BUSY).
///
/// Use it on your own statements; task-dedup's own errors say it with
/// [`DedupError::Timeout`].
pub fn is_timeout(err: &DbErr) -> bool {
    Kind::of(err) == Kind::Timeout
}
