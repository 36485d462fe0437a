//! Rows of [`columns!`](crate::dialect) as [`task_run::Model`]s, straight from sqlx's
//! row on PostgreSQL.
//!
//! SeaORM reads an `Option` column through an error for NULL: it formats the column's
//! name into the error's `String`, then turns the error into `None`. A task has seven
//! nullable columns, mostly NULL while it is queued: about 5,700 client instructions
//! and a dozen allocations for every task read (callgrind, BENCHMARKS.md). sqlx's own
//! `Option` decoding looks at the NULL and nothing else. MySQL/MariaDB and SQLite rows
//! go through SeaORM's mapping, whose conversions (UUIDs and timestamps stored as text
//! or bytes) they need.

#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
use sea_orm::sqlx;
use sea_orm::{DbErr, FromQueryResult, QueryResult};

use task_dedup_entity::task_run;

/// A row of [`columns!`](crate::dialect), read into a task.
pub(crate) trait TaskRow {
    fn task(self) -> Result<task_run::Model, DbErr>;
}

impl TaskRow for &QueryResult {
    fn task(self) -> Result<task_run::Model, DbErr> {
        task_run::Model::from_query_result(self, "")
    }
}

#[cfg(feature = "postgres")]
impl TaskRow for sqlx::postgres::PgRow {
    fn task(self) -> Result<task_run::Model, DbErr> {
        use sea_orm::Iterable;
        use sqlx::Row;
        use sqlx::postgres::{PgRow, Postgres};
        use task_dedup_entity::{TaskScope, TaskStatus};

        fn get<'r, T>(row: &'r PgRow, column: &str) -> Result<T, DbErr>
        where
            T: sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
        {
            row.try_get(column)
                .map_err(|err| DbErr::Type(format!("task_run.{column}: {err}")))
        }
        // The key's columns and the lease owner without sqlx's check of the column's
        // type (four comparisons a column for `varchar`): every statement binds them
        // as text, so a table where they are not text fails each statement before a
        // row comes back. The bytes are still checked to be UTF-8.
        fn text<'r, T: sqlx::Decode<'r, Postgres>>(
            row: &'r PgRow,
            column: &str,
        ) -> Result<T, DbErr> {
            row.try_get_unchecked(column)
                .map_err(|err| DbErr::Type(format!("task_run.{column}: {err}")))
        }
        // The two enum columns, read as borrowed text: no String per row.
        fn named<T: Iterable>(
            row: &PgRow,
            column: &str,
            name: fn(&T) -> &'static str,
        ) -> Result<T, DbErr> {
            let value: &str = get(row, column)?;
            T::iter()
                .find(|variant| name(variant) == value)
                .ok_or_else(|| DbErr::Type(format!("task_run.{column}: unknown value {value:?}")))
        }
        let row = &self;
        Ok(task_run::Model {
            id: get(row, "id")?,
            user_id: text(row, "user_id")?,
            task_type: text(row, "task_type")?,
            resource_key: text(row, "resource_key")?,
            status: named(row, "status", |s: &TaskStatus| s.as_str())?,
            payload: get(row, "payload")?,
            result: get(row, "result")?,
            error: get(row, "error")?,
            attempts: get(row, "attempts")?,
            lease_owner: text(row, "lease_owner")?,
            lease_expires_at: get(row, "lease_expires_at")?,
            created_at: get(row, "created_at")?,
            updated_at: get(row, "updated_at")?,
            started_at: get(row, "started_at")?,
            finished_at: get(row, "finished_at")?,
            run_at: get(row, "run_at")?,
            priority: get(row, "priority")?,
            scope: named(row, "scope", |s: &TaskScope| s.as_str())?,
            dedup_window_end: get(row, "dedup_window_end")?,
            concurrent: get(row, "concurrent")?,
            snoozes: get(row, "snoozes")?,
        })
    }
}

#[cfg(feature = "mysql")]
impl TaskRow for sqlx::mysql::MySqlRow {
    fn task(self) -> Result<task_run::Model, DbErr> {
        (&QueryResult::from(self)).task()
    }
}

#[cfg(feature = "sqlite")]
impl TaskRow for sqlx::sqlite::SqliteRow {
    fn task(self) -> Result<task_run::Model, DbErr> {
        (&QueryResult::from(self)).task()
    }
}
