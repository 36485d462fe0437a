//! Maintenance: `task_run_finished_idx` over `(status, finished_at)`, which serves the
//! pruner's batches (the oldest finished tasks of one status first), and
//! `task_dedup_paused`, the task types whose tasks no worker claims while they are in it.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Idempotent (each object is created only where missing), so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds `task_run_finished_idx` and the table `task_dedup_paused`.
#[derive(DeriveMigrationName)]
pub struct Migration;

const FINISHED_IDX: &str = "task_run_finished_idx";

const SQLITE_FINISHED_INDEX: &str =
    "CREATE INDEX \"task_run_finished_idx\" ON \"task_run\" (\"status\", \"finished_at\")";
/// The type name byte for byte, as in `task_run` (SQLite compares text with BINARY).
const SQLITE_PAUSED: &str = "CREATE TABLE IF NOT EXISTS \"task_dedup_paused\" ( \
    \"task_type\" varchar(64) NOT NULL PRIMARY KEY, \
    \"paused_at\" timestamp_with_timezone_text NOT NULL )";
const SQLITE_DOWN: [&str; 2] = [
    "DROP TABLE IF EXISTS \"task_dedup_paused\"",
    "DROP INDEX IF EXISTS \"task_run_finished_idx\"",
];

const POSTGRES_FINISHED_INDEX: &str =
    "CREATE INDEX task_run_finished_idx ON task_run (status, finished_at)";
const POSTGRES_PAUSED: &str = "CREATE TABLE IF NOT EXISTS task_dedup_paused ( \
    task_type varchar(64) NOT NULL PRIMARY KEY, \
    paused_at timestamp with time zone NOT NULL )";
const POSTGRES_DOWN: [&str; 2] = [
    "DROP TABLE IF EXISTS task_dedup_paused",
    "DROP INDEX IF EXISTS task_run_finished_idx",
];

const MYSQL_FINISHED_INDEX: &str =
    "CREATE INDEX task_run_finished_idx ON task_run (status, finished_at)";
/// `VARBINARY`, like `task_run.task_type`: type names compare byte for byte (4 bytes a
/// character). `datetime(6)` holds UTC, like every timestamp of `task_run`.
const MYSQL_PAUSED: &str = "CREATE TABLE IF NOT EXISTS task_dedup_paused ( \
    task_type varbinary(256) NOT NULL PRIMARY KEY, \
    paused_at datetime(6) NOT NULL )";
const MYSQL_DOWN: [&str; 2] = [
    "DROP TABLE IF EXISTS task_dedup_paused",
    "ALTER TABLE task_run DROP INDEX task_run_finished_idx",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let (index, paused) = match Dialect::of(manager)? {
            Dialect::Sqlite => (SQLITE_FINISHED_INDEX, SQLITE_PAUSED),
            Dialect::Postgres => (POSTGRES_FINISHED_INDEX, POSTGRES_PAUSED),
            Dialect::MySql => (MYSQL_FINISHED_INDEX, MYSQL_PAUSED),
        };
        sql::create_index_if_missing(manager, FINISHED_IDX, index).await?;
        sql::run(manager, &[paused]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let down: &[&str] = match Dialect::of(manager)? {
            Dialect::Sqlite => &SQLITE_DOWN,
            Dialect::Postgres => &POSTGRES_DOWN,
            Dialect::MySql => &MYSQL_DOWN,
        };
        sql::run(manager, down).await
    }

    /// SQLite and PostgreSQL: the index and the table in one transaction.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }
}
