//! The index that serves a list by key prefix (`TaskFilter::key_prefix`): the keys in
//! byte order, so that the keys starting with a prefix are one range of it (MariaDB,
//! SQLite: `resource_key >= prefix AND resource_key < the prefix's successor`;
//! PostgreSQL: a `LIKE 'prefix%'`, which the planner turns into that range). Without it
//! a prefix that matches few tasks walks `task_run_created_idx` to its end.
//!
//! Byte order on every dialect: PostgreSQL builds it `COLLATE "C"` whatever the
//! database's collation (an `en_US` order would not keep a prefix's keys together; the
//! planner reads a `LIKE` prefix's range from a `"C"` index whatever the column's
//! collation, checked with an ICU `en-US` column); MySQL/MariaDB's `VARBINARY` and
//! SQLite's `BINARY` compare bytes already.
//!
//! Frozen once released: this file states its DDL per dialect and never changes.
//!
//! Idempotent (created only where missing), so it also runs after
//! [`ensure_schema`](crate::ensure_schema).

use sea_orm_migration::prelude::*;

use crate::sql::{self, Dialect};

/// Adds `task_run_key_prefix_idx (resource_key)`, in byte order.
#[derive(DeriveMigrationName)]
pub struct Migration;

/// The index's name.
const NAME: &str = "task_run_key_prefix_idx";

const SQLITE_UP: &str =
    "CREATE INDEX \"task_run_key_prefix_idx\" ON \"task_run\" (\"resource_key\")";
const SQLITE_DOWN: &str = "DROP INDEX IF EXISTS \"task_run_key_prefix_idx\"";

const POSTGRES_UP: &str =
    "CREATE INDEX task_run_key_prefix_idx ON task_run (resource_key COLLATE \"C\")";
const POSTGRES_DOWN: &str = "DROP INDEX IF EXISTS task_run_key_prefix_idx";

const MYSQL_UP: &str = "CREATE INDEX task_run_key_prefix_idx ON task_run (resource_key)";
const MYSQL_DOWN: &str = "ALTER TABLE task_run DROP INDEX task_run_key_prefix_idx";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let up = match Dialect::of(manager)? {
            Dialect::Sqlite => SQLITE_UP,
            Dialect::Postgres => POSTGRES_UP,
            Dialect::MySql => MYSQL_UP,
        };
        sql::create_index_if_missing(manager, NAME, up).await?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each dialect's statement creates the index of its name.
    #[test]
    fn statements_create_the_named_index() {
        for sql in [SQLITE_UP, POSTGRES_UP, MYSQL_UP] {
            assert!(
                sql.replace('"', "").contains(&format!("INDEX {NAME} ON")),
                "{sql}"
            );
        }
    }
}
