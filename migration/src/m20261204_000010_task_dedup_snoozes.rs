//! `snoozes`: how many times a task's handler snoozed it (`HandlerError::Snooze`: "run me
//! again in d"). A snooze puts the task back in the queue without counting its attempt,
//! so the count is what bounds a handler that snoozes for ever (the worker's
//! `max_snoozes`).
//!
//! Online on every dialect: a column with a constant default is added without rewriting
//! the table (PostgreSQL 11+ keeps the default in the catalog; MariaDB 10.3+ and MySQL
//! 8.0.12+ add it `ALGORITHM=INSTANT`; SQLite writes the schema only). The brief lock
//! PostgreSQL still takes is what [`online`](crate::online) bounds with `lock_timeout`.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Idempotent (added only where missing), so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds `task_run.snoozes`, 0 for every task so far.
#[derive(DeriveMigrationName)]
pub struct Migration;

const SQLITE_UP: &str =
    "ALTER TABLE \"task_run\" ADD COLUMN \"snoozes\" integer NOT NULL DEFAULT 0";
const SQLITE_DOWN: &str = "ALTER TABLE \"task_run\" DROP COLUMN \"snoozes\"";

const POSTGRES_UP: &str =
    "ALTER TABLE task_run ADD COLUMN IF NOT EXISTS snoozes integer NOT NULL DEFAULT 0";
const POSTGRES_DOWN: &str = "ALTER TABLE task_run DROP COLUMN IF EXISTS snoozes";

const MYSQL_UP: &str = "ALTER TABLE task_run ADD COLUMN snoozes int NOT NULL DEFAULT 0";
const MYSQL_DOWN: &str = "ALTER TABLE task_run DROP COLUMN snoozes";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.has_column("task_run", "snoozes").await? {
            return Ok(());
        }
        let up = match Dialect::of(manager)? {
            Dialect::Sqlite => SQLITE_UP,
            Dialect::Postgres => POSTGRES_UP,
            Dialect::MySql => MYSQL_UP,
        };
        sql::run(manager, &[up]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if !manager.has_column("task_run", "snoozes").await? {
            return Ok(());
        }
        let down = match Dialect::of(manager)? {
            Dialect::Sqlite => SQLITE_DOWN,
            Dialect::Postgres => POSTGRES_DOWN,
            Dialect::MySql => MYSQL_DOWN,
        };
        sql::run(manager, &[down]).await
    }
}
