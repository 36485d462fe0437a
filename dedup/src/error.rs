//! [`DedupError`], the one error type of the crate, and the classification of driver
//! errors that the rest of the crate relies on.

use std::fmt;
use std::ops::Deref;

use sea_orm::{DbErr, RuntimeErr, SqlErr};
use uuid::Uuid;

use crate::TaskStatus;
use crate::key::TaskKey;
use crate::task_run::ACTIVE_RESOURCE_UIDX;

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
    /// Any other database error, including an unreachable database or a pool timeout.
    #[error(transparent)]
    Database(#[from] DbErr),
}

impl DedupError {
    /// Whether running the same operation again (for [`TransactionAborted`], the whole
    /// transaction) may succeed: [`Contention`] and [`TransactionAborted`].
    ///
    /// [`Contention`]: DedupError::Contention
    /// [`TransactionAborted`]: DedupError::TransactionAborted
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            DedupError::Contention { .. } | DedupError::TransactionAborted(_)
        )
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
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transition::Heartbeat => "heartbeat",
            Transition::Complete => "complete",
            Transition::Fail => "fail",
            Transition::Cancel => "cancel",
        })
    }
}

/// Checks a string argument against its column: not empty, at most `max_chars`
/// characters, no NUL byte.
pub(crate) fn check_text(text: &str, max_chars: usize) -> Result<(), InvalidReason> {
    if text.is_empty() {
        return Err(InvalidReason::Empty);
    }
    check_free_text(text, max_chars)
}

/// The longest `error` text (a failure message or cancellation reason), in characters:
/// MySQL's `TEXT` holds 65,535 bytes, which is 16,383 characters of 4-byte UTF-8.
pub const MAX_ERROR_CHARS: usize = 16_383;

/// Checks text that may be empty: at most `max_chars` characters, no NUL byte (which
/// PostgreSQL cannot store in text or JSON).
pub(crate) fn check_free_text(text: &str, max_chars: usize) -> Result<(), InvalidReason> {
    if text.contains('\0') {
        return Err(InvalidReason::ContainsNul);
    }
    // Byte length bounds the character count: skip counting for short strings.
    if text.len() > max_chars {
        let chars = text.chars().count();
        if chars > max_chars {
            return Err(InvalidReason::TooLong { max_chars, chars });
        }
    }
    Ok(())
}

/// Whether the insert hit `task_active_resource_uidx` (and not some other constraint).
///
/// Drivers name the violated index only inside the message: PostgreSQL and
/// MySQL/MariaDB give its name, SQLite lists its columns. This is the one place that
/// reads message text.
pub(crate) fn is_active_index_violation(err: &DbErr) -> bool {
    const SQLITE_INDEX_COLUMNS: &str =
        "task_run.user_id, task_run.task_type, task_run.resource_key";
    matches!(err.sql_err(), Some(SqlErr::UniqueConstraintViolation(message))
        if message.contains(ACTIVE_RESOURCE_UIDX) || message.contains(SQLITE_INDEX_COLUMNS))
}

/// Whether the database aborted a statement to resolve a deadlock or a serialization
/// conflict: SQLSTATE 40001 (PostgreSQL serialization failure, InnoDB deadlock 1213) or
/// 40P01 (PostgreSQL deadlock).
///
/// Inside a transaction the whole transaction is gone (InnoDB rolls it back, PostgreSQL
/// refuses every further statement): roll it back and run it again from the start. Use
/// this on your own statements that share a transaction with `find_or_enqueue`; for
/// task-dedup's own errors see [`DedupError::is_retryable`].
pub fn is_transaction_conflict(err: &DbErr) -> bool {
    if let DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) = err
        && let sea_orm::sqlx::Error::Database(db_err) = e.deref()
    {
        return matches!(db_err.code().as_deref(), Some("40001" | "40P01"));
    }
    false
}

/// Rejects a JSON argument (`name`) with a NUL character in a string or key:
/// PostgreSQL's `jsonb` cannot store U+0000, while SQLite and MySQL would, so it is
/// refused everywhere.
pub(crate) fn check_json_argument(
    name: &'static str,
    value: Option<&serde_json::Value>,
) -> Result<(), DedupError> {
    match value {
        Some(value) if json_has_nul(value) => Err(DedupError::InvalidArgument {
            name,
            reason: InvalidReason::ContainsNul,
        }),
        _ => Ok(()),
    }
}

fn json_has_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(json_has_nul),
        Value::Object(fields) => fields
            .iter()
            .any(|(name, field)| name.contains('\0') || json_has_nul(field)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_with_nul_anywhere_is_rejected() {
        let ok = serde_json::json!({"a": ["b", {"c": 1.5}], "d": null});
        assert!(check_json_argument("payload", Some(&ok)).is_ok());
        assert!(check_json_argument("payload", None).is_ok());
        for bad in [
            serde_json::json!("a\0"),
            serde_json::json!([1, ["x\0"]]),
            serde_json::json!({"k\0": 1}),
            serde_json::json!({"k": {"deep": "\0"}}),
        ] {
            assert!(
                matches!(
                    check_json_argument("payload", Some(&bad)),
                    Err(DedupError::InvalidArgument {
                        name: "payload",
                        reason: InvalidReason::ContainsNul
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn check_text_counts_characters_not_bytes() {
        assert_eq!(check_text("", 3), Err(InvalidReason::Empty));
        assert_eq!(check_text("a\0b", 3), Err(InvalidReason::ContainsNul));
        assert_eq!(check_text("ééé", 3), Ok(()));
        assert_eq!(
            check_text("éééé", 3),
            Err(InvalidReason::TooLong {
                max_chars: 3,
                chars: 4
            })
        );
    }
}
