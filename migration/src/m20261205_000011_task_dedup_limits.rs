//! `task_dedup_limits`: flow control per task type, stored where every worker of every
//! process reads it. A row limits its type: how many of its tasks run at once anywhere
//! (`max_running`), how many per user (`max_running_per_user`), and how many start per
//! fixed window of `rate_window_micros` (`rate_starts`; the current window's start and
//! count are `window_start_micros` and `window_starts`, by the database's clock); with
//! `fair`, its claims take users in turn, continuing after `fair_cursor`, the last user
//! served. A claim of a limited type locks its row, counts the type's running tasks and
//! starts only what the limits leave; claims of other types never read it but to pass
//! over limited types.
//!
//! `run_slot` and `task_run_slot_uidx`: a task started under a type's `max_running` of N
//! holds one of the numbers 0..N, unique among the type's running tasks, so claims of
//! the type take free numbers without waiting for each other and the index refuses a
//! number taken twice (PostgreSQL and SQLite: a partial unique index over running rows
//! with a number; MySQL/MariaDB: the virtual generated column `running_run_slot`, the
//! number while the task runs and NULL otherwise, under a unique index).
//!
//! `task_run_user_queue_idx`: each user's queued tasks of a type in claim order, so a
//! fair claim finds the next user with queued work, and that user's first task, in an
//! index lookup each, however long another user's backlog (PostgreSQL and SQLite: over
//! queued tasks only; MySQL/MariaDB have no partial index and lead with `status`).
//!
//! Online: the table is new; the index is built `CONCURRENTLY` on PostgreSQL and
//! `ALGORITHM=INPLACE, LOCK=NONE` on MySQL/MariaDB by [`online`](crate::online).
//!
//! Frozen once released: this file states its DDL per dialect and never changes.

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds the table `task_dedup_limits` and `task_run_user_queue_idx`.
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
    \"fair\" boolean NOT NULL DEFAULT false, \
    \"fair_cursor\" varchar(64) NULL, \
    \"updated_at\" timestamp_with_timezone_text NOT NULL )";
const SQLITE_INDEX: &str = "CREATE INDEX \"task_run_user_queue_idx\" ON \"task_run\" \
    (\"task_type\", \"user_id\", \"priority\" DESC, \"run_at\", \"created_at\", \"id\") \
    WHERE \"status\" = 'queued'";
const SQLITE_SLOT: [&str; 1] = ["ALTER TABLE \"task_run\" ADD COLUMN \"run_slot\" integer NULL"];
const SQLITE_SLOT_INDEX: &str = "CREATE UNIQUE INDEX \"task_run_slot_uidx\" ON \"task_run\" \
    (\"task_type\", \"run_slot\") WHERE \"status\" = 'running' AND \"run_slot\" IS NOT NULL";
const SQLITE_DOWN: [&str; 4] = [
    "DROP INDEX IF EXISTS \"task_run_slot_uidx\"",
    "ALTER TABLE \"task_run\" DROP COLUMN \"run_slot\"",
    "DROP INDEX IF EXISTS \"task_run_user_queue_idx\"",
    "DROP TABLE IF EXISTS \"task_dedup_limits\"",
];

const POSTGRES_UP: &str = "CREATE TABLE IF NOT EXISTS task_dedup_limits ( \
    task_type varchar(64) NOT NULL PRIMARY KEY, \
    max_running integer NULL, \
    max_running_per_user integer NULL, \
    rate_starts integer NULL, \
    rate_window_micros bigint NULL, \
    window_start_micros bigint NOT NULL DEFAULT 0, \
    window_starts integer NOT NULL DEFAULT 0, \
    fair boolean NOT NULL DEFAULT false, \
    fair_cursor varchar(64) NULL, \
    updated_at timestamp with time zone NOT NULL )";
const POSTGRES_INDEX: &str = "CREATE INDEX task_run_user_queue_idx ON task_run \
    (task_type, user_id, priority DESC, run_at, created_at, id) WHERE status = 'queued'";
const POSTGRES_SLOT: [&str; 1] =
    ["ALTER TABLE task_run ADD COLUMN IF NOT EXISTS run_slot integer NULL"];
const POSTGRES_SLOT_INDEX: &str = "CREATE UNIQUE INDEX task_run_slot_uidx ON task_run \
    (task_type, run_slot) WHERE status = 'running' AND run_slot IS NOT NULL";
const POSTGRES_DOWN: [&str; 4] = [
    "DROP INDEX IF EXISTS task_run_slot_uidx",
    "ALTER TABLE task_run DROP COLUMN IF EXISTS run_slot",
    "DROP INDEX IF EXISTS task_run_user_queue_idx",
    "DROP TABLE IF EXISTS task_dedup_limits",
];

/// `VARBINARY`, like `task_run.task_type` and `user_id`: names compare byte for byte.
const MYSQL_UP: &str = "CREATE TABLE IF NOT EXISTS task_dedup_limits ( \
    task_type varbinary(256) NOT NULL PRIMARY KEY, \
    max_running int NULL, \
    max_running_per_user int NULL, \
    rate_starts int NULL, \
    rate_window_micros bigint NULL, \
    window_start_micros bigint NOT NULL DEFAULT 0, \
    window_starts int NOT NULL DEFAULT 0, \
    fair boolean NOT NULL DEFAULT false, \
    fair_cursor varbinary(256) NULL, \
    updated_at datetime(6) NOT NULL )";
const MYSQL_INDEX: &str = "CREATE INDEX task_run_user_queue_idx ON task_run \
    (task_type, status, user_id, priority DESC, run_at, created_at, id)";
/// A virtual column: computed when read, so adding it rewrites no row.
const MYSQL_SLOT: [&str; 2] = [
    "ALTER TABLE task_run ADD COLUMN run_slot int NULL",
    "ALTER TABLE task_run ADD COLUMN running_run_slot int \
     GENERATED ALWAYS AS (CASE WHEN status = 'running' THEN run_slot END) VIRTUAL",
];
const MYSQL_SLOT_INDEX: &str =
    "CREATE UNIQUE INDEX task_run_slot_uidx ON task_run (task_type, running_run_slot)";
const MYSQL_DOWN: [&str; 4] = [
    "ALTER TABLE task_run DROP INDEX task_run_slot_uidx",
    "ALTER TABLE task_run DROP COLUMN running_run_slot, DROP COLUMN run_slot",
    "ALTER TABLE task_run DROP INDEX task_run_user_queue_idx",
    "DROP TABLE IF EXISTS task_dedup_limits",
];

/// The indexes' names.
const INDEX: &str = "task_run_user_queue_idx";
const SLOT_INDEX: &str = "task_run_slot_uidx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let (table, index, slot, slot_index): (_, _, &[&str], _) = match Dialect::of(manager)? {
            Dialect::Sqlite => (SQLITE_UP, SQLITE_INDEX, &SQLITE_SLOT, SQLITE_SLOT_INDEX),
            Dialect::Postgres => (
                POSTGRES_UP,
                POSTGRES_INDEX,
                &POSTGRES_SLOT,
                POSTGRES_SLOT_INDEX,
            ),
            Dialect::MySql => (MYSQL_UP, MYSQL_INDEX, &MYSQL_SLOT, MYSQL_SLOT_INDEX),
        };
        sql::run(manager, &[table]).await?;
        sql::create_index_if_missing(manager, INDEX, index).await?;
        if !manager.has_column("task_run", "run_slot").await? {
            sql::run(manager, slot).await?;
        }
        sql::create_index_if_missing(manager, SLOT_INDEX, slot_index).await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let down: &[&str] = match Dialect::of(manager)? {
            Dialect::Sqlite => &SQLITE_DOWN,
            Dialect::Postgres => &POSTGRES_DOWN,
            Dialect::MySql => &MYSQL_DOWN,
        };
        sql::run(manager, down).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each dialect's statement creates the index of its name.
    #[test]
    fn statements_create_the_named_index() {
        for (sql, name) in [
            (SQLITE_INDEX, INDEX),
            (POSTGRES_INDEX, INDEX),
            (MYSQL_INDEX, INDEX),
            (SQLITE_SLOT_INDEX, SLOT_INDEX),
            (POSTGRES_SLOT_INDEX, SLOT_INDEX),
            (MYSQL_SLOT_INDEX, SLOT_INDEX),
        ] {
            assert!(
                sql.replace('"', "").contains(&format!("INDEX {name} ON")),
                "{sql}"
            );
        }
    }
}
