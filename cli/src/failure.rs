//! [`Failure`]: why the command stopped, as one line and an exit status.

use std::io::Write;
use std::process::ExitCode;

use sea_orm::{DbErr, RuntimeErr};
use task_dedup::DedupError;

/// Exit status of a failure: the database, a refused action, no such task.
const FAILED: u8 = 1;
/// Exit status of bad usage: an argument clap or the library refused before any SQL.
const USAGE: u8 = 2;

/// Why the command stopped: one line for stderr and the exit status.
#[derive(Debug)]
pub(crate) struct Failure {
    status: u8,
    message: String,
}

impl Failure {
    /// Bad usage: exit status 2.
    pub(crate) fn usage(message: impl Into<String>) -> Failure {
        Failure {
            status: USAGE,
            message: message.into(),
        }
    }

    /// A failure: exit status 1.
    pub(crate) fn failed(message: impl Into<String>) -> Failure {
        Failure {
            status: FAILED,
            message: message.into(),
        }
    }

    /// A database error, with the fix when the tables are missing.
    pub(crate) fn database(err: DbErr) -> Failure {
        if is_missing_table(&err) {
            return Failure::failed(format!(
                "{err} (the database lacks task-dedup's tables: run `task-dedup migrate up`)"
            ));
        }
        Failure::failed(err.to_string())
    }

    /// clap's refusal of the arguments as one line (its first paragraph), status 2;
    /// help and the version print as clap prints them, status 0.
    pub(crate) fn from_clap(err: clap::Error) -> Failure {
        use clap::error::ErrorKind;
        if matches!(
            err.kind(),
            ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        ) {
            err.exit();
        }
        let text = err.to_string();
        let first: Vec<&str> = text
            .lines()
            .map(str::trim)
            .take_while(|line| !line.is_empty())
            .collect();
        let line = first.join(" ");
        Failure::usage(line.strip_prefix("error: ").unwrap_or(&line))
    }

    /// Prints the line and gives the exit status.
    pub(crate) fn report(self) -> ExitCode {
        // A message from the database may span lines; the contract is one.
        let line = self
            .message
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        // A closed stderr leaves the exit status to tell.
        let _ = writeln!(std::io::stderr(), "task-dedup: {line}");
        ExitCode::from(self.status)
    }
}

impl From<DedupError> for Failure {
    fn from(err: DedupError) -> Failure {
        match err {
            DedupError::InvalidArgument { .. } | DedupError::InvalidKey { .. } => {
                Failure::usage(err.to_string())
            }
            DedupError::KeyHeld { id, holder } => Failure::failed(format!(
                "cannot retry task {id}: its key is held by task {} ({}), which does the work",
                holder.id, holder.status
            )),
            DedupError::Database(db) => Failure::database(db),
            other => Failure::failed(other.to_string()),
        }
    }
}

/// PostgreSQL's SQLSTATE for a table that does not exist (`undefined_table`), and
/// MySQL/MariaDB's (`ER_NO_SUCH_TABLE`).
const PG_UNDEFINED_TABLE: &str = "42P01";
const MYSQL_NO_SUCH_TABLE: &str = "42S02";

/// Whether `err` says a table does not exist: the database was never migrated.
fn is_missing_table(err: &DbErr) -> bool {
    let (DbErr::Exec(RuntimeErr::SqlxError(sqlx)) | DbErr::Query(RuntimeErr::SqlxError(sqlx))) =
        err
    else {
        return false;
    };
    let Some(db) = sqlx.as_database_error() else {
        return false;
    };
    match db.code().as_deref() {
        Some(PG_UNDEFINED_TABLE | MYSQL_NO_SUCH_TABLE) => true,
        // SQLite reports it as a generic error (code 1): only the text tells.
        Some("1") => db.message().starts_with("no such table"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line_with_status_2() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Args {
            #[arg(long)]
            limit: u32,
        }
        let err = Args::try_parse_from(["x"]).expect_err("--limit is required");
        let failure = Failure::from_clap(err);
        assert_eq!(failure.status, USAGE);
        assert_eq!(
            failure.message,
            "the following required arguments were not provided: --limit <LIMIT>"
        );
    }
}
