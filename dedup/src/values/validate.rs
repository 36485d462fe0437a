//! Input validation: every argument is checked here, against the column limits of the
//! entity, before any SQL runs. A leaf: it names what is wrong ([`InvalidReason`],
//! [`InvalidArgument`]) and the error type turns that into a `DedupError`.

use std::fmt;
use std::time::Duration;

use task_dedup_entity::task_run::{ERROR_MAX_CHARS, LEASE_OWNER_MAX_CHARS, TASK_TYPE_MAX_CHARS};

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
    /// Text that does not have the expected form (which the message names).
    Malformed(&'static str),
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
            InvalidReason::Malformed(expected) => write!(f, "malformed: expected {expected}"),
        }
    }
}

/// An argument (`name`) that was rejected, and why: a
/// [`DedupError::InvalidArgument`](crate::DedupError::InvalidArgument) once it leaves
/// the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidArgument {
    pub name: &'static str,
    pub reason: InvalidReason,
}

impl InvalidArgument {
    pub(crate) fn new(name: &'static str, reason: InvalidReason) -> InvalidArgument {
        InvalidArgument { name, reason }
    }

    /// A number or duration out of range: `expected` says what is accepted.
    pub(crate) fn out_of_range(name: &'static str, expected: &'static str) -> InvalidArgument {
        InvalidArgument::new(name, InvalidReason::OutOfRange(expected))
    }
}

/// The longest lease accepted: leases are meant to be renewed by heartbeats.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Checks a string argument against its column: not empty, at most `max_chars`
/// characters, no NUL byte.
pub(crate) fn text(text: &str, max_chars: usize) -> Result<(), InvalidReason> {
    if text.is_empty() {
        return Err(InvalidReason::Empty);
    }
    free_text(text, max_chars)
}

/// Checks text that may be empty: at most `max_chars` characters, no NUL byte (which
/// PostgreSQL cannot store in text or JSON).
pub(crate) fn free_text(text: &str, max_chars: usize) -> Result<(), InvalidReason> {
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

/// A worker id: it goes into `lease_owner`.
pub(crate) fn worker_id(worker_id: &str) -> Result<(), InvalidArgument> {
    text(worker_id, LEASE_OWNER_MAX_CHARS)
        .map_err(|reason| InvalidArgument::new("worker_id", reason))
}

/// Task types a worker asks for.
pub(crate) fn task_types(task_types: &[&str]) -> Result<(), InvalidArgument> {
    for task_type in task_types {
        text(task_type, TASK_TYPE_MAX_CHARS)
            .map_err(|reason| InvalidArgument::new("task_types", reason))?;
    }
    Ok(())
}

/// A failure message or cancellation reason (argument `name`): it goes into `error`.
pub(crate) fn error_text(name: &'static str, text: &str) -> Result<(), InvalidArgument> {
    free_text(text, ERROR_MAX_CHARS).map_err(|reason| InvalidArgument::new(name, reason))
}

/// The most tasks one [`claim_many`](crate::TaskLifecycle::claim_many) takes.
pub const MAX_CLAIM: usize = 1_000;

// A claim text with a bound (PostgreSQL's) holds a claim of up to its largest bound.
const _: () = assert!(MAX_CLAIM as i64 <= crate::dialect::render::LARGEST_BOUND);

/// The most task endings a [`Worker`](crate::Worker) records in one batch
/// ([`WorkerBuilder::batch_endings`](crate::WorkerBuilder::batch_endings)).
pub const MAX_END_BATCH: usize = 1_000;

/// How many tasks a claim takes, as SQL binds it: 1 to [`MAX_CLAIM`].
pub(crate) fn claim_max(max: usize) -> Result<i64, InvalidArgument> {
    if max == 0 || max > MAX_CLAIM {
        return Err(InvalidArgument::out_of_range(
            "max",
            "1 to 1,000 (MAX_CLAIM)",
        ));
    }
    Ok(max as i64)
}

/// A lease length, in microseconds: more than zero and at most [`MAX_LEASE`].
pub(crate) fn lease_micros(lease: Duration) -> Result<i64, InvalidArgument> {
    if lease.is_zero() || lease > MAX_LEASE {
        return Err(InvalidArgument::out_of_range(
            "lease",
            "more than zero and at most 7 days",
        ));
    }
    micros("lease", lease)
}

/// A duration in microseconds, as SQL takes it.
pub(crate) fn micros(name: &'static str, duration: Duration) -> Result<i64, InvalidArgument> {
    i64::try_from(duration.as_micros())
        .map_err(|_| InvalidArgument::out_of_range(name, "fits in i64 microseconds"))
}

/// Rejects a JSON argument (`name`) with a NUL character in a string or key:
/// PostgreSQL's `jsonb` cannot store U+0000, while SQLite and MySQL would, so it is
/// refused everywhere.
pub(crate) fn json(
    name: &'static str,
    value: Option<&serde_json::Value>,
) -> Result<(), InvalidArgument> {
    match value {
        Some(value) if json_has_nul(value) => {
            Err(InvalidArgument::new(name, InvalidReason::ContainsNul))
        }
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
        assert!(json("payload", Some(&ok)).is_ok());
        assert!(json("payload", None).is_ok());
        for bad in [
            serde_json::json!("a\0"),
            serde_json::json!([1, ["x\0"]]),
            serde_json::json!({"k\0": 1}),
            serde_json::json!({"k": {"deep": "\0"}}),
        ] {
            assert!(
                json("payload", Some(&bad))
                    == Err(InvalidArgument::new("payload", InvalidReason::ContainsNul)),
                "{bad}"
            );
        }
    }

    #[test]
    fn text_counts_characters_not_bytes() {
        assert_eq!(text("", 3), Err(InvalidReason::Empty));
        assert_eq!(text("a\0b", 3), Err(InvalidReason::ContainsNul));
        assert_eq!(text("ééé", 3), Ok(()));
        assert_eq!(
            text("éééé", 3),
            Err(InvalidReason::TooLong {
                max_chars: 3,
                chars: 4
            })
        );
    }

    #[test]
    fn leases_are_bounded() {
        assert!(lease_micros(Duration::ZERO).is_err());
        assert_eq!(lease_micros(Duration::from_secs(1)).ok(), Some(1_000_000));
        assert!(lease_micros(MAX_LEASE).is_ok());
        assert!(lease_micros(MAX_LEASE + Duration::from_micros(1)).is_err());
    }
}
