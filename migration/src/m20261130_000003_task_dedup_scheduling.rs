//! Scheduling: `run_at` (not claimable before) and `priority` (higher first), and the
//! claim index that serves their order.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Tasks that predate the columns get `run_at` 1970-01-01 (runnable now) and priority 0;
//! they keep their order among themselves (`created_at`) and come before tasks enqueued
//! afterwards, as they did. Idempotent: each column and the index change happen only
//! where missing, so it also runs after [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds `run_at` and `priority`, and rebuilds `task_run_claim_idx` as
/// `(status, priority DESC, run_at, created_at, id)`.
#[derive(DeriveMigrationName)]
pub struct Migration;

const SQLITE_RUN_AT: &str = "ALTER TABLE \"task_run\" ADD COLUMN \"run_at\" \
    timestamp_with_timezone_text NOT NULL DEFAULT '1970-01-01T00:00:00+00:00'";
const SQLITE_PRIORITY: &str =
    "ALTER TABLE \"task_run\" ADD COLUMN \"priority\" smallint NOT NULL DEFAULT 0";
const SQLITE_CLAIM_INDEX: [&str; 2] = [
    "DROP INDEX IF EXISTS \"task_run_claim_idx\"",
    "CREATE INDEX \"task_run_claim_idx\" ON \"task_run\" \
     (\"status\", \"priority\" DESC, \"run_at\", \"created_at\", \"id\")",
];
const SQLITE_DOWN: [&str; 4] = [
    "DROP INDEX IF EXISTS \"task_run_claim_idx\"",
    "CREATE INDEX \"task_run_claim_idx\" ON \"task_run\" (\"status\", \"created_at\", \"id\")",
    "ALTER TABLE \"task_run\" DROP COLUMN \"priority\"",
    "ALTER TABLE \"task_run\" DROP COLUMN \"run_at\"",
];

const POSTGRES_RUN_AT: &str = "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS run_at \
    timestamp with time zone NOT NULL DEFAULT '1970-01-01 00:00:00+00'";
const POSTGRES_PRIORITY: &str =
    "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0";
const POSTGRES_CLAIM_INDEX: [&str; 2] = [
    "DROP INDEX IF EXISTS task_run_claim_idx",
    "CREATE INDEX task_run_claim_idx ON task_run (status, priority DESC, run_at, created_at, id)",
];
const POSTGRES_DOWN: [&str; 4] = [
    "DROP INDEX IF EXISTS task_run_claim_idx",
    "CREATE INDEX task_run_claim_idx ON task_run (status, created_at, id)",
    "ALTER TABLE task_run DROP COLUMN IF EXISTS priority",
    "ALTER TABLE task_run DROP COLUMN IF EXISTS run_at",
];

/// `datetime(6)` holds UTC, like every timestamp of the table.
const MYSQL_RUN_AT: &str = "ALTER TABLE task_run ADD COLUMN run_at datetime(6) NOT NULL \
    DEFAULT '1970-01-01 00:00:00.000000'";
const MYSQL_PRIORITY: &str = "ALTER TABLE task_run ADD COLUMN priority smallint NOT NULL DEFAULT 0";
/// One statement: the table is never without its claim index. Descending key parts need
/// MariaDB 10.8 or MySQL 8 (older servers accept and ignore DESC).
const MYSQL_CLAIM_INDEX: [&str; 1] = ["ALTER TABLE task_run DROP INDEX task_run_claim_idx, \
     ADD INDEX task_run_claim_idx (status, priority DESC, run_at, created_at, id)"];
const MYSQL_DOWN: [&str; 1] = ["ALTER TABLE task_run DROP INDEX task_run_claim_idx, \
     ADD INDEX task_run_claim_idx (status, created_at, id), \
     DROP COLUMN priority, DROP COLUMN run_at"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let dialect = Dialect::of(manager)?;
        let (run_at, priority, claim_index): (&str, &str, &[&str]) = match dialect {
            Dialect::Sqlite => (SQLITE_RUN_AT, SQLITE_PRIORITY, &SQLITE_CLAIM_INDEX),
            Dialect::Postgres => (POSTGRES_RUN_AT, POSTGRES_PRIORITY, &POSTGRES_CLAIM_INDEX),
            Dialect::MySql => (MYSQL_RUN_AT, MYSQL_PRIORITY, &MYSQL_CLAIM_INDEX),
        };
        if !manager.has_column("task_run", "run_at").await? {
            sql::run(manager, &[run_at]).await?;
        }
        if !manager.has_column("task_run", "priority").await? {
            sql::run(manager, &[priority]).await?;
        }
        let claim_columns = sql::index_columns(manager, dialect, "task_run_claim_idx").await?;
        if !claim_columns.iter().any(|c| c == "priority") {
            sql::run(manager, claim_index).await?;
        }
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

    /// SQLite and PostgreSQL: the index is dropped and rebuilt in one transaction.
    fn use_transaction(&self) -> Option<bool> {
        Some(true)
    }
}
