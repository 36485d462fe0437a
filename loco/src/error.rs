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
    Dedup(DedupError),
    /// A table of task-dedup's (`task_run`, `task_dedup_*`) is not in the application's
    /// database: task-dedup's migrations did not run there. Append them to the
    /// application's migrator (`migration/src/lib.rs`) and run `cargo loco db migrate`
    /// (or let `auto_migrate: true` run them at boot).
    #[error(
        "the table {table} is missing from the application's database: run `cargo loco db migrate` \
         (with task-dedup's migrations appended to the application's in migration/src/lib.rs); \
         the database said: {source}"
    )]
    MissingTable {
        /// The table the database named.
        table: String,
        /// The database's error.
        source: DedupError,
    },
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

impl From<DedupError> for QueueError {
    /// [`QueueError::MissingTable`] when the database says a table of task-dedup's does
    /// not exist, else [`QueueError::Dedup`].
    fn from(err: DedupError) -> QueueError {
        let table = match &err {
            DedupError::Database(db) => missing_table(&db.to_string()),
            _ => None,
        };
        match table {
            Some(table) => QueueError::MissingTable { table, source: err },
            None => QueueError::Dedup(err),
        }
    }
}

/// The table of task-dedup's that a database error says does not exist: SQLite's `no
/// such table: t`, PostgreSQL's `relation "t" does not exist` (42P01, in its English
/// messages), MySQL/MariaDB's `Table 'db.t' doesn't exist` (1146). The drivers' error
/// types are not reachable without a driver of this crate's own, so the message is read.
fn missing_table(message: &str) -> Option<String> {
    let between = |start: &str, end: &str| {
        let (_, rest) = message.split_once(start)?;
        let (name, _) = rest.split_once(end)?;
        Some(name)
    };
    let sqlite = || {
        let (_, rest) = message.split_once("no such table: ")?;
        rest.split(|c: char| c.is_whitespace() || c == ')').next()
    };
    let table = between("relation \"", "\" does not exist")
        .or_else(|| between("Table '", "' doesn't exist"))
        .or_else(sqlite)?;
    // `main.task_run`, `app_db.task_run`: the schema or database is not the point.
    let table = table.rsplit('.').next().unwrap_or(table);
    (table == "task_run" || table.starts_with("task_dedup_")).then(|| table.to_owned())
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

#[cfg(test)]
mod tests {
    use super::missing_table;

    #[test]
    fn each_dialect_saying_a_table_is_missing() {
        for (message, table) in [
            (
                "Execution Error: error returned from database: (code: 1) no such table: task_run",
                Some("task_run"),
            ),
            (
                "Query Error: error returned from database: no such table: main.task_dedup_paused",
                Some("task_dedup_paused"),
            ),
            (
                "Execution Error: error returned from database: relation \"task_run\" does not exist",
                Some("task_run"),
            ),
            (
                "Execution Error: error returned from database: 1146 (42S02): Table 'app.task_run' doesn't exist",
                Some("task_run"),
            ),
            // Another table, another error.
            ("no such table: users", None),
            ("relation \"users\" does not exist", None),
            ("Table 'app.users' doesn't exist", None),
            ("lost the database connection", None),
        ] {
            assert_eq!(missing_table(message).as_deref(), table, "{message}");
        }
    }
}
