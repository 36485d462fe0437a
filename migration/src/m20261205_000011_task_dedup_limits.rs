//! `task_dedup_limits`: flow control per task type, stored where every worker of every
//! process reads it. A row limits its type: how many of its tasks run at once anywhere
//! (`max_running`), how many per user (`max_running_per_user`), and how many start per
//! fixed window of `rate_window_micros` (`rate_starts`; the current window's start and
//! count are `window_start_micros` and `window_starts`, by the database's clock). A
//! claim of a limited type locks its row, counts the type's running tasks and starts
//! only what the limits leave; claims of other types never read it but to pass over
//! limited types.
//!
//! Online on every dialect: a new table, which no writer of `task_run` waits behind.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds the table `task_dedup_limits`.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// The type name byte for byte, as in `task_run` (SQLite compares text with BINARY).
const SQLITE_UP: &str = "CREATE TABLE IF NOT EXISTS \"task_dedup_limits\" ( \
    \"task_type\" varchar(64) NOT NULL PRIMARY KEY, \
    \"max_running\" integer NULL, \
    \"max_running_per_user\" integer NULL, \
    \"rate_starts\" integer NULL, \
    \"rate_window_micros\" bigint NULL, \
    \"window_start_micros\" bigint NOT NULL DEFAULT 0, \
    \"window_starts\" integer NOT NULL DEFAULT 0, \
    \"updated_at\" timestamp_with_timezone_text NOT NULL )";
const SQLITE_DOWN: &str = "DROP TABLE IF EXISTS \"task_dedup_limits\"";

const POSTGRES_UP: &str = "CREATE TABLE IF NOT EXISTS task_dedup_limits ( \
    task_type varchar(64) NOT NULL PRIMARY KEY, \
    max_running integer NULL, \
    max_running_per_user integer NULL, \
    rate_starts integer NULL, \
    rate_window_micros bigint NULL, \
    window_start_micros bigint NOT NULL DEFAULT 0, \
    window_starts integer NOT NULL DEFAULT 0, \
    updated_at timestamp with time zone NOT NULL )";
const POSTGRES_DOWN: &str = "DROP TABLE IF EXISTS task_dedup_limits";

/// `VARBINARY`, like `task_run.task_type`: type names compare byte for byte.
const MYSQL_UP: &str = "CREATE TABLE IF NOT EXISTS task_dedup_limits ( \
    task_type varbinary(256) NOT NULL PRIMARY KEY, \
    max_running int NULL, \
    max_running_per_user int NULL, \
    rate_starts int NULL, \
    rate_window_micros bigint NULL, \
    window_start_micros bigint NOT NULL DEFAULT 0, \
    window_starts int NOT NULL DEFAULT 0, \
    updated_at datetime(6) NOT NULL )";
const MYSQL_DOWN: &str = "DROP TABLE IF EXISTS task_dedup_limits";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let up = match Dialect::of(manager)? {
            Dialect::Sqlite => SQLITE_UP,
            Dialect::Postgres => POSTGRES_UP,
            Dialect::MySql => MYSQL_UP,
        };
        sql::run(manager, &[up]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let down = match Dialect::of(manager)? {
            Dialect::Sqlite => SQLITE_DOWN,
            Dialect::Postgres => POSTGRES_DOWN,
            Dialect::MySql => MYSQL_DOWN,
        };
        sql::run(manager, &[down]).await
    }
}
