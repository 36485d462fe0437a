//! [`Cursor`]: a position in a list of tasks, and [`Page`]: one page of a list and the
//! cursor of the next.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::values::error::DedupError;
use crate::values::validate::{InvalidArgument, InvalidReason};
use task_dedup_entity::task_run;

/// A position in a list of tasks: the `(created_at, id)` of the last task of a page.
/// The next page is the tasks beyond it in the list's order, read from the index
/// (keyset pagination: no `OFFSET`), so a page never repeats or skips a task however
/// many tasks are inserted or removed meanwhile.
///
/// Opaque to applications: pass it on as it is, in code or as text (a query parameter
/// of a dashboard). Its text is `<created_at in microseconds since the epoch>.<id>`;
/// [`FromStr`] takes nothing else ([`DedupError::InvalidArgument`] named `cursor`), so a
/// bad cursor fails before any SQL runs.
///
/// ```
/// use task_dedup::Cursor;
///
/// let cursor: Cursor = "1780000000123456.0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6".parse()?;
/// assert_eq!(cursor.to_string().parse::<Cursor>()?, cursor);
/// assert!("12.not-a-uuid".parse::<Cursor>().is_err());
/// # Ok::<(), task_dedup::DedupError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cursor {
    created_at: DateTime<Utc>,
    id: Uuid,
}

impl Cursor {
    /// The position of `task`: a list continued from it starts with the task after it.
    pub fn of(task: &task_run::Model) -> Cursor {
        Cursor {
            created_at: task_run::micros(task.created_at),
            id: task.id,
        }
    }

    /// The creation time and id it points at.
    pub(crate) fn position(self) -> (DateTime<Utc>, Uuid) {
        (self.created_at, self.id)
    }
}

/// What a cursor's text looks like, for the error.
const CURSOR_FORM: &str = "<created_at microseconds>.<task id>";

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.created_at.timestamp_micros(), self.id)
    }
}

impl FromStr for Cursor {
    type Err = DedupError;

    fn from_str(text: &str) -> Result<Cursor, DedupError> {
        let malformed = || {
            DedupError::from(InvalidArgument::new(
                "cursor",
                InvalidReason::Malformed(CURSOR_FORM),
            ))
        };
        let (micros, id) = text.split_once('.').ok_or_else(malformed)?;
        // `i64::from_str` takes a leading `+`: the text must be the one `Display` writes.
        if micros.starts_with('+') {
            return Err(malformed());
        }
        let micros: i64 = micros.parse().map_err(|_| malformed())?;
        let created_at = DateTime::from_timestamp_micros(micros).ok_or_else(malformed)?;
        let id = Uuid::try_parse(id).map_err(|_| malformed())?;
        Ok(Cursor { created_at, id })
    }
}

/// One page of [`TaskAdmin::list_tasks`](crate::TaskAdmin::list_tasks).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Page {
    /// The tasks, in the list's order.
    pub tasks: Vec<task_run::Model>,
    /// Where the next page starts ([`ListTasks::after`](crate::ListTasks::after)), or
    /// `None` when this is the last page (no task lay beyond it when it was read).
    pub next: Option<Cursor>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let id = Uuid::now_v7();
        for micros in [0, 1_780_000_000_123_456, -5] {
            let created_at = DateTime::from_timestamp_micros(micros).expect("in range");
            let cursor = Cursor { created_at, id };
            assert_eq!(cursor.to_string().parse::<Cursor>().ok(), Some(cursor));
        }
        for bad in [
            "",
            ".",
            "123",
            "abc.0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6",
            "+1.0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6",
            "1.2.3",
            "1.0190a8c2",
            "99999999999999999999.0190a8c2-5b1e-7c3d-8e4f-a1b2c3d4e5f6",
        ] {
            match bad.parse::<Cursor>() {
                Err(DedupError::InvalidArgument { name: "cursor", .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
